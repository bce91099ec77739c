# azd's Windows hooks (azure.yaml's `windows:` entries): each runs the same
# bash script as on Linux and macOS, with Git for Windows' bash, found
# beside git.exe, never whichever `bash` comes first on PATH (WSL's
# bash.exe would run the script in another system, without this machine's
# az, cargo or Python).
#
#   ./infra/hooks/bash.ps1 <hook>     runs infra/hooks/<hook>.sh
param([Parameter(Mandatory = $true)][string]$Hook)
$ErrorActionPreference = 'Stop'

$bash = $null
$git = Get-Command git -ErrorAction SilentlyContinue
if ($git) {
  # git.exe is in <Git>\cmd, <Git>\bin or <Git>\mingw64\bin.
  $dir = Split-Path -Parent $git.Source
  foreach ($root in @((Split-Path -Parent $dir), (Split-Path -Parent (Split-Path -Parent $dir)))) {
    $candidate = Join-Path $root 'bin\bash.exe'
    if (Test-Path $candidate) { $bash = $candidate; break }
  }
}
if (-not $bash) {
  Write-Error "order-guard's azd hooks run in bash: install Git for Windows (https://git-scm.com/download/win), whose bash they use, then run azd again; or run azd from WSL."
  exit 1
}
& $bash "$PSScriptRoot/$Hook.sh"
exit $LASTEXITCODE
