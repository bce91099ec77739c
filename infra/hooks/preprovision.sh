#!/usr/bin/env bash
# azd preprovision: what the deployment needs, checked before anything is
# created, and the Azure SQL Entra admin's login name.
#
# The hooks run az as whoever az is signed in as, while azd provisions as
# whoever azd is signed in as (AZURE_PRINCIPAL_ID, the SQL admin and the
# operator's roles): the two must be one identity, a user or a service
# principal, or the database steps after provisioning would be refused.
set -euo pipefail
cd "$(dirname "$0")/../.."
. infra/hooks/lib.sh
: "${AZURE_SUBSCRIPTION_ID:?azd sets AZURE_SUBSCRIPTION_ID: run this through azd (azd up, azd provision)}"

require az "the Azure CLI (https://learn.microsoft.com/cli/azure/install-azure-cli), then az login"
require sqlcmd "go-sqlcmd (https://learn.microsoft.com/sql/tools/sqlcmd/go-sqlcmd-utility), for the app's database user"
require cargo "the Rust toolchain (https://rustup.rs), for the package and migrate"
require rustup "the Rust toolchain by rustup (https://rustup.rs): the package's musl target comes from it"
find_python

if ! account=$(azs account show --query "[user.name, user.type]" -o tsv 2>/dev/null); then
  echo "error: az cannot reach subscription $AZURE_SUBSCRIPTION_ID: sign in with az login (a service principal: az login --service-principal) as the identity azd deploys as" >&2
  exit 1
fi
read -r name type <<<"$account"

# The object id az signs in with, from its token's claims (works for users
# and service principals alike, with no directory read).
token=$(azs account get-access-token --query accessToken -o tsv)
oid=$("$PYTHON" -c '
import base64, json, sys
part = sys.argv[1].split(".")[1]
print(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))).get("oid", ""))
' "$token")
if [ -n "${AZURE_PRINCIPAL_ID:-}" ] && [ "$oid" != "$AZURE_PRINCIPAL_ID" ]; then
  echo "error: az is signed in as $name (object id $oid), azd as object id $AZURE_PRINCIPAL_ID: the hooks use az for the database, so sign both in as the same identity (az login / azd auth login), then run azd up again" >&2
  exit 1
fi

# The region offers what the template creates there: Flex Consumption for
# custom handlers and Azure Managed Redis (Azure SQL is in every public
# region). Asked of Azure, not a list kept here: Azure adds regions. A
# question Azure does not answer is said and skipped, not guessed.
region_offers() {
  local what=$1 names=$2 wanted
  wanted=$(printf '%s' "$AZURE_LOCATION" | tr -d ' ' | tr '[:upper:]' '[:lower:]')
  names=$(printf '%s\n' "$names" | tr -d ' \r' | tr '[:upper:]' '[:lower:]')
  case $'\n'"$names"$'\n' in
    *$'\n'"$wanted"$'\n'*) return 0 ;;
  esac
  echo "error: region $AZURE_LOCATION does not offer $what, which the template creates there; pick another:" >&2
  echo "  azd env set AZURE_LOCATION <region>   (regions that offer it: README, \"Region\")" >&2
  exit 1
}
if [ -n "${AZURE_LOCATION:-}" ]; then
  if flex=$(azs functionapp list-flexconsumption-locations --runtime custom --query "[].name" -o tsv 2>/dev/null) \
    && [ -n "$flex" ]; then
    region_offers "Flex Consumption for custom handlers" "$flex"
  else
    warn "could not ask Azure which regions offer Flex Consumption; provisioning goes on"
  fi
  if redis=$(azs provider show --namespace Microsoft.Cache \
    --query "resourceTypes[?resourceType=='redisEnterprise'].locations[]" -o tsv 2>/dev/null) \
    && [ -n "$redis" ]; then
    region_offers "Azure Managed Redis" "$redis"
  else
    warn "could not ask Azure which regions offer Azure Managed Redis; provisioning goes on"
  fi
fi

# A user's sign-in name, or a service principal's application id: the
# login name of the SQL admin (its object id is what Azure SQL checks).
echo "==> deploying as $type $name"
azd env set AZURE_PRINCIPAL_NAME "$name"
