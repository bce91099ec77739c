//! Which events' traces are exported: head sampling, decided when an
//! event's span starts (`OTEL_TRACES_SAMPLER`, read by `config`).
//!
//! - The tracer provider's sampler is parent-based: a step's child span
//!   follows its event's decision, so a trace is exported whole or not at
//!   all. The event's span itself never has a parent (the host sends a
//!   custom handler no `traceparent`), so `parentbased_X` behaves as `X`.
//! - A span sampled out is dropped where it starts
//!   (`SamplingDecision::Drop`): the SDK makes a non-recording span, the
//!   event builds none of its attributes and none of its children, and
//!   nothing reaches the batch processor. It costs the decision.
//! - Metrics are never sampled: every counter and histogram counts every
//!   event whatever the sampler decides.
//! - [`RateLimited`] (`microsoft.rate_limited`, the default with Application
//!   Insights) is a GCRA token bucket (`governor`'s direct limiter):
//!   `per_second` traces a second on average, a burst of one second's worth
//!   (so at most about twice the rate in any one second).

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, MonotonicClock};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, SamplingResult, ShouldSample};

/// Traces per second of `microsoft.rate_limited` without an argument, and
/// the default with Application Insights: the default of Microsoft's own
/// Azure Monitor exporters (.NET since 1.6.0-beta.2, the JavaScript
/// distro's `tracesPerSecond`).
pub const DEFAULT_TRACES_PER_SECOND: f64 = 5.0;

/// Which events' traces are exported. Built by `config`, which refuses a
/// ratio outside 0..=1 and a rate that is not a positive number, so no
/// value is NaN (hence `Eq`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// Every event's trace (`always_on`, `parentbased_always_on`).
    AlwaysOn,
    /// No trace (`always_off`, `parentbased_always_off`); metrics are
    /// exported as ever.
    AlwaysOff,
    /// Each event's trace with this probability, decided by its trace id
    /// (`traceidratio`, `parentbased_traceidratio`,
    /// `microsoft.fixed_percentage`).
    Ratio(f64),
    /// This many traces per second on average, with a burst of one
    /// second's worth (`microsoft.rate_limited`).
    RateLimited(f64),
}

impl Eq for Sampling {}

impl Sampling {
    /// The tracer provider's sampler.
    pub(super) fn sampler(self) -> Sampler {
        let root: Box<dyn ShouldSample> = match self {
            Sampling::AlwaysOn => Box::new(Sampler::AlwaysOn),
            Sampling::AlwaysOff => Box::new(Sampler::AlwaysOff),
            Sampling::Ratio(p) => Box::new(Sampler::TraceIdRatioBased(p)),
            Sampling::RateLimited(n) if n > 0.0 => Box::new(RateLimited::new(n, MonotonicClock)),
            // Not built by `config` (a rate must be more than 0): none.
            Sampling::RateLimited(_) => Box::new(Sampler::AlwaysOff),
        };
        Sampler::ParentBased(root)
    }

    /// The share of events whose traces are exported, when it is fixed:
    /// what Application Insights is told (its `sampleRate`, from which it
    /// counts `itemCount`). `None` for a rate limit, whose share depends on
    /// the load.
    pub(super) fn fixed_ratio(self) -> Option<f64> {
        match self {
            Sampling::AlwaysOn => Some(1.0),
            Sampling::AlwaysOff => Some(0.0),
            Sampling::Ratio(p) => Some(p.clamp(0.0, 1.0)),
            Sampling::RateLimited(_) => None,
        }
    }
}

impl fmt::Display for Sampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sampling::AlwaysOn => f.write_str("every event's trace exported"),
            Sampling::AlwaysOff => f.write_str("no trace exported"),
            Sampling::Ratio(p) => write!(f, "each event's trace exported with probability {p}"),
            Sampling::RateLimited(n) => write!(f, "{n} traces a second exported on average"),
        }
    }
}

/// The quota of `per_second` traces: one every `1 / per_second` s, and a
/// burst of one second's worth, at least one (pure).
pub(super) fn quota(per_second: f64) -> Quota {
    let period = Duration::try_from_secs_f64(1.0 / per_second)
        .unwrap_or(Duration::MAX)
        .max(Duration::from_nanos(1));
    let burst = per_second.ceil().clamp(1.0, f64::from(u32::MAX)) as u32;
    Quota::with_period(period)
        .expect("a period of at least 1 ns")
        .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN))
}

type Limiter<C> = RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// `per_second` root spans a second on average: the root sampler of
/// `microsoft.rate_limited` (its parent-based wrapper makes the children
/// follow). One compare-and-swap on an atomic per decision; clones share
/// the bucket.
pub(super) struct RateLimited<C: Clock = MonotonicClock> {
    per_second: f64,
    limiter: Arc<Limiter<C>>,
}

impl<C: Clock> Clone for RateLimited<C> {
    fn clone(&self) -> Self {
        RateLimited {
            per_second: self.per_second,
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<C: Clock> RateLimited<C> {
    pub(super) fn new(per_second: f64, clock: C) -> RateLimited<C> {
        RateLimited {
            per_second,
            limiter: Arc::new(RateLimiter::direct_with_clock(quota(per_second), clock)),
        }
    }

    /// Whether a trace starting now is exported (takes a token if so).
    fn admit(&self) -> bool {
        self.limiter.check().is_ok()
    }
}

impl<C: Clock> fmt::Debug for RateLimited<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimited")
            .field("per_second", &self.per_second)
            .finish()
    }
}

impl<C> ShouldSample for RateLimited<C>
where
    C: Clock + Send + Sync + 'static,
    C::Instant: Send + Sync,
{
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        _trace_id: TraceId,
        _name: &str,
        _span_kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[Link],
    ) -> SamplingResult {
        SamplingResult {
            decision: decision(self.admit()),
            attributes: Vec::new(),
            trace_state: parent_context
                .map(|cx| cx.span().span_context().trace_state().clone())
                .unwrap_or_default(),
        }
    }
}

/// A sampled span is recorded and exported; any other is dropped where it
/// starts, never merely recorded (pure).
fn decision(sampled: bool) -> SamplingDecision {
    if sampled {
        SamplingDecision::RecordAndSample
    } else {
        SamplingDecision::Drop
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceState};

    use super::*;

    /// The decision for a root span with `trace_id`.
    fn root(sampler: &dyn ShouldSample, trace_id: u128) -> SamplingDecision {
        sampler
            .should_sample(
                Some(&Context::new()),
                TraceId::from(trace_id),
                "process OrderTrigger",
                &SpanKind::Consumer,
                &[],
                &[],
            )
            .decision
    }

    /// The decision for a child of a parent that was (or was not) sampled.
    fn child(sampler: &dyn ShouldSample, parent_sampled: bool) -> SamplingDecision {
        let flags = if parent_sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let parent = SpanContext::new(
            TraceId::from(7u128),
            SpanId::from(9u64),
            flags,
            false,
            TraceState::default(),
        );
        let cx = Context::new().with_remote_span_context(parent);
        sampler
            .should_sample(
                Some(&cx),
                TraceId::from(7u128),
                "execute",
                &SpanKind::Client,
                &[],
                &[],
            )
            .decision
    }

    const SAMPLED: SamplingDecision = SamplingDecision::RecordAndSample;
    const DROPPED: SamplingDecision = SamplingDecision::Drop;

    #[test]
    fn a_rate_limit_admits_a_second_s_burst_then_one_per_period() {
        let clock = FakeRelativeClock::default();
        let limited = RateLimited::new(5.0, clock.clone());
        let admitted = |n: usize| (0..n).filter(|_| limited.admit()).count();
        assert_eq!(admitted(100), 5, "the burst at start");
        clock.advance(Duration::from_millis(199));
        assert_eq!(admitted(10), 0, "not a token before 200 ms");
        clock.advance(Duration::from_millis(1));
        assert_eq!(admitted(10), 1, "one token every 200 ms");
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            admitted(100),
            5,
            "an idle minute refills one burst, no more"
        );
        // Under a steady overload: over 10 s, 5 a second.
        let mut total = 0;
        for _ in 0..1000 {
            clock.advance(Duration::from_millis(10));
            total += admitted(3);
        }
        assert_eq!(total, 50);
    }

    #[test]
    fn a_rate_below_one_a_second_has_a_burst_of_one() {
        let clock = FakeRelativeClock::default();
        let limited = RateLimited::new(0.5, clock.clone());
        assert!(limited.admit());
        assert!(!limited.admit());
        clock.advance(Duration::from_millis(1999));
        assert!(!limited.admit(), "one trace every 2 s");
        clock.advance(Duration::from_millis(1));
        assert!(limited.admit());
    }

    #[test]
    fn the_quota_is_one_second_s_worth() {
        assert_eq!(
            quota(5.0),
            Quota::per_second(NonZeroU32::new(5).unwrap()),
            "5 a second"
        );
        assert_eq!(quota(0.5).burst_size().get(), 1);
        assert_eq!(quota(0.5).replenish_interval(), Duration::from_secs(2));
        assert_eq!(quota(2.5).burst_size().get(), 3);
        assert_eq!(quota(1e6).replenish_interval(), Duration::from_micros(1));
    }

    #[test]
    fn the_rate_limited_sampler_drops_what_it_does_not_admit_and_children_follow() {
        let clock = FakeRelativeClock::default();
        let sampler = Sampler::ParentBased(Box::new(RateLimited::new(2.0, clock.clone())));
        assert_eq!(root(&sampler, 1), SAMPLED);
        assert_eq!(root(&sampler, 2), SAMPLED);
        assert_eq!(root(&sampler, 3), DROPPED, "a third in the same instant");
        // Children take no token: they follow their parent.
        for _ in 0..10 {
            assert_eq!(child(&sampler, true), SAMPLED);
            assert_eq!(child(&sampler, false), DROPPED);
        }
        clock.advance(Duration::from_millis(500));
        assert_eq!(root(&sampler, 4), SAMPLED, "a token every 500 ms");
    }

    #[test]
    fn a_ratio_is_decided_by_the_trace_id_at_its_boundary() {
        // The SDK compares the trace id's low 64 bits, shifted right once,
        // with ratio × 2^63.
        let half = Sampling::Ratio(0.5).sampler();
        assert_eq!(root(&half, 0), SAMPLED);
        assert_eq!(root(&half, (1u128 << 63) - 2), SAMPLED, "just below");
        assert_eq!(root(&half, 1u128 << 63), DROPPED, "at the boundary");
        assert_eq!(root(&half, u128::from(u64::MAX)), DROPPED);
        // The same trace id, the same decision (high bits do not count).
        assert_eq!(root(&half, (5u128 << 64) | 3), SAMPLED);
        let none = Sampling::Ratio(0.0).sampler();
        let all = Sampling::Ratio(1.0).sampler();
        for id in [0, 1, (1u128 << 63) - 1, u128::from(u64::MAX), u128::MAX] {
            assert_eq!(root(&none, id), DROPPED, "ratio 0, {id}");
            assert_eq!(root(&all, id), SAMPLED, "ratio 1, {id}");
        }
        assert_eq!(child(&none, true), SAMPLED, "a child follows its parent");
        assert_eq!(child(&all, false), DROPPED, "a child follows its parent");
    }

    #[test]
    fn always_on_and_off() {
        let on = Sampling::AlwaysOn.sampler();
        let off = Sampling::AlwaysOff.sampler();
        for id in [1, u128::MAX] {
            assert_eq!(root(&on, id), SAMPLED);
            assert_eq!(root(&off, id), DROPPED);
        }
        assert_eq!(root(&Sampling::RateLimited(0.0).sampler(), 1), DROPPED);
    }

    #[test]
    fn the_start_s_log_line_says_what_is_exported() {
        let said = |s: Sampling| s.to_string();
        assert_eq!(said(Sampling::AlwaysOn), "every event's trace exported");
        assert_eq!(said(Sampling::AlwaysOff), "no trace exported");
        assert_eq!(
            said(Sampling::Ratio(0.1)),
            "each event's trace exported with probability 0.1"
        );
        assert_eq!(
            said(Sampling::RateLimited(5.0)),
            "5 traces a second exported on average"
        );
    }

    #[test]
    fn application_insights_is_told_a_fixed_share_only() {
        assert_eq!(Sampling::AlwaysOn.fixed_ratio(), Some(1.0));
        assert_eq!(Sampling::Ratio(0.1).fixed_ratio(), Some(0.1));
        assert_eq!(Sampling::AlwaysOff.fixed_ratio(), Some(0.0));
        assert_eq!(Sampling::RateLimited(5.0).fixed_ratio(), None);
    }
}
