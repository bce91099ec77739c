//! Processes' CPU time from `/proc` (shared by `bench` and
//! `telemetry_cost`, which includes this file by its path).

use std::process::Command;

use anyhow::Context;

/// User + system CPU seconds of process `pid` (`/proc/<pid>/stat`, all
/// its threads).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces), from field 3:
    // utime is field 14, stime field 15, in clock ticks.
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields.get(i).context("short stat")?.parse::<u64>()? as f64)
    };
    Ok((ticks(11)? + ticks(12)?) / clock_ticks_per_second())
}

/// `getconf CLK_TCK` (100 on Linux unless the kernel says otherwise).
pub fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}
