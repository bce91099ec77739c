//! How fast the fleet recovers from each store fault: from the
//! moment the store is back (the outage over, the engine accepting logins)
//! to the first `executed` answer, and to the first second that executes at
//! 90 % of the rate of the seconds before the fault.

use super::*;

/// Before a store fault, the rate is averaged over this long.
pub(crate) const PRE_FAULT_WINDOW: Duration = Duration::from_secs(3);
/// The rate after a fault is counted over windows of this length.
pub(crate) const RATE_WINDOW: Duration = Duration::from_secs(1);
/// How long after a fault the recovery is looked for.
pub(crate) const RECOVERY_HORIZON: Duration = Duration::from_secs(20);
/// Other faults keep this far from a store fault, before its start and
/// after its nominal end, so each recovery is the store's alone.
pub(crate) const QUIET_BEFORE: Duration = Duration::from_secs(2);
pub(crate) const QUIET_AFTER: Duration = Duration::from_secs(4);

/// One store fault as it happened.
#[derive(Debug, Clone)]
pub(crate) struct StoreFault {
    pub(crate) kind: &'static str,
    pub(crate) started: Instant,
    /// When the store could be used again.
    pub(crate) back: Instant,
}

/// The recovery after one store fault.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Recovery {
    /// `executed` answers per second over [`PRE_FAULT_WINDOW`] before it.
    pub(crate) pre_rate: f64,
    /// From the store being back to the first `executed` answer after it.
    pub(crate) first_executed: Option<Duration>,
    /// From the store being back to the start of the first
    /// [`RATE_WINDOW`] that executed at least 90 % of `pre_rate`.
    pub(crate) to_90_percent: Option<Duration>,
}

/// Read the recovery from the `executed` answers' times (sorted). Pure.
pub(crate) fn recovery(executed: &[Instant], fault: &StoreFault) -> Recovery {
    let count = |from: Instant, to: Instant| {
        executed.partition_point(|t| *t < to) - executed.partition_point(|t| *t < from)
    };
    let pre_start = fault
        .started
        .checked_sub(PRE_FAULT_WINDOW)
        .unwrap_or(fault.started);
    let pre_span = (fault.started - pre_start).as_secs_f64();
    let pre_rate = if pre_span > 0.0 {
        count(pre_start, fault.started) as f64 / pre_span
    } else {
        0.0
    };
    let horizon = fault.back + RECOVERY_HORIZON;
    let after: Vec<Instant> = executed[executed.partition_point(|t| *t < fault.back)..]
        .iter()
        .copied()
        .take_while(|t| *t < horizon)
        .collect();
    let first_executed = after.first().map(|t| *t - fault.back);
    // Windows start at the store's return and at every answer after it: the
    // earliest window reaching the rate starts at one of those.
    let want = 0.9 * pre_rate * RATE_WINDOW.as_secs_f64();
    let starts = std::iter::once(fault.back).chain(after.iter().copied());
    let to_90_percent = (pre_rate > 0.0)
        .then(|| {
            starts
                .into_iter()
                .find(|s| count(*s, *s + RATE_WINDOW) as f64 >= want)
                .map(|s| s - fault.back)
        })
        .flatten();
    Recovery {
        pre_rate,
        first_executed,
        to_90_percent,
    }
}

/// `executed` answers in each second of the run (a timeline for the log).
pub(crate) fn per_second(executed: &[Instant], started: Instant) -> Vec<u32> {
    let mut seconds = Vec::new();
    for t in executed {
        let s = t.saturating_duration_since(started).as_secs() as usize;
        if seconds.len() <= s {
            seconds.resize(s + 1, 0);
        }
        seconds[s] += 1;
    }
    seconds
}

/// One line per store fault for the summary.
pub(crate) fn recovery_lines(
    executed: &[Instant],
    faults: &[StoreFault],
    started: Instant,
) -> Vec<String> {
    let secs =
        |d: Option<Duration>| d.map_or("never".to_string(), |d| format!("{:.2}s", d.as_secs_f64()));
    faults
        .iter()
        .map(|f| {
            let r = recovery(executed, f);
            format!(
                "chaos: store_fault={} at={:.1}s down={:.1}s pre_rate={:.1}/s back_to_first_executed={} back_to_90pct_rate={}",
                f.kind,
                (f.started - started).as_secs_f64(),
                (f.back - f.started).as_secs_f64(),
                r.pre_rate,
                secs(r.first_executed),
                secs(r.to_90_percent),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: &[u64]) -> Vec<Instant> {
        ms.iter()
            .map(|m| base + Duration::from_millis(*m))
            .collect()
    }

    #[test]
    fn recovery_is_measured_from_the_store_being_back() {
        let base = Instant::now();
        // 10/s for the three seconds before a fault at 3 s, nothing while it
        // lasts (3 s to 4 s), the first answer 200 ms after it, then 10/s
        // again from 4.5 s.
        let mut ms: Vec<u64> = (0..30).map(|i| i * 100).collect();
        ms.push(4_200);
        ms.extend((0..30).map(|i| 4_500 + i * 100));
        let executed = at(base, &ms);
        let fault = StoreFault {
            kind: "db_outage",
            started: base + Duration::from_millis(3_000),
            back: base + Duration::from_millis(4_000),
        };
        let r = recovery(&executed, &fault);
        assert!((r.pre_rate - 10.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r.first_executed, Some(Duration::from_millis(200)));
        // [4.2 s, 5.2 s) holds 4.2 plus 4.5..=5.1: 8 answers, under 9; the
        // window from 4.5 s holds 10.
        assert_eq!(r.to_90_percent, Some(Duration::from_millis(500)));
    }

    #[test]
    fn a_fleet_that_never_recovers_says_never() {
        let base = Instant::now();
        let executed = at(base, &[0, 500, 1_000, 1_500, 2_000, 2_500]);
        let fault = StoreFault {
            kind: "engine_restart",
            started: base + Duration::from_millis(3_000),
            back: base + Duration::from_millis(6_000),
        };
        let r = recovery(&executed, &fault);
        assert_eq!((r.first_executed, r.to_90_percent), (None, None));
    }
}
