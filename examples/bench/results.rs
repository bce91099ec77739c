//! Results: entries with their ratios to ceilings, the table and the targets.

use super::*;

#[derive(Serialize, Clone)]
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
    pub(crate) concurrency: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ratio_to_ceiling: Option<f64>,
    /// Which ceiling the ratio is taken against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ceiling: Option<String>,
    /// Extra ratios: against each ceiling when a figure has two (the
    /// duplicate path), or the pooled ratio beside a median of rounds.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) ratios: BTreeMap<String, f64>,
    /// Each round's figure, for the spread within this run: its throughput,
    /// or for a CPU ratio, that round's ratio.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) per_round: Vec<f64>,
}

pub(crate) fn entry(
    name: &str,
    value: f64,
    unit: &'static str,
    concurrency: Option<usize>,
) -> Entry {
    Entry {
        name: name.to_string(),
        value,
        unit,
        concurrency,
        ratio_to_ceiling: None,
        ceiling: None,
        ratios: BTreeMap::new(),
        per_round: Vec::new(),
    }
}

/// The median (of an even count, the mean of the two middle values).
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n.is_multiple_of(2) => Some((sorted[mid - 1] + sorted[mid]) / 2.0),
        _ => Some(sorted[mid]),
    }
}

pub(crate) fn round3(x: f64) -> f64 {
    if x.abs() >= 100.0 {
        x.round()
    } else {
        (x * 1000.0).round() / 1000.0
    }
}

pub(crate) const PERCENTILES: [(&str, f64); 3] = [("p50", 0.50), ("p99", 0.99), ("p99.9", 0.999)];

/// Throughput + latency entries for `name`; ratios against `ceilings`
/// (throughput: figure ÷ ceiling; latency: ceiling ÷ figure, so 1.0 is "as
/// fast as the ceiling" either way). The headline ratio is against the lowest
/// ceiling throughput, and every ratio is listed in `ratios`.
pub(crate) fn figure_entries(
    name: &str,
    unit: &'static str,
    c: usize,
    s: &Series,
    percentiles: &[(&str, f64)],
    ceilings: &[(&str, &Series)],
) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut t = entry(&format!("{name}_throughput"), s.rate(), unit, Some(c));
    t.per_round = s.per_round.iter().map(|x| x.round()).collect();
    if let Some((cname, cs)) = ceilings
        .iter()
        .min_by(|a, b| a.1.rate().total_cmp(&b.1.rate()))
    {
        t.ratio_to_ceiling = Some(s.rate() / cs.rate());
        t.ceiling = Some(format!("{cname}_throughput"));
        if ceilings.len() > 1 {
            for (cname, cs) in ceilings {
                t.ratios
                    .insert(format!("{cname}_throughput"), s.rate() / cs.rate());
            }
        }
    }
    out.push(t);
    for (pname, q) in percentiles {
        let mut e = entry(&format!("{name}_{pname}"), s.ms(*q), "ms", Some(c));
        if let Some((cname, cs)) = ceilings.first() {
            e.ratio_to_ceiling = Some(cs.ms(*q) / s.ms(*q));
            e.ceiling = Some(format!("{cname}_{pname}"));
        }
        out.push(e);
    }
    out
}

pub(crate) fn print_table(entries: &[Entry]) {
    println!(
        "{:<32} {:>4} {:>12} {:<9} {:>7}  ceiling",
        "figure", "c", "value", "unit", "ratio"
    );
    println!("{}", "-".repeat(90));
    for e in entries {
        let c = e.concurrency.map_or("-".into(), |c| c.to_string());
        let ratio = e.ratio_to_ceiling.map_or("-".into(), |r| format!("{r:.3}"));
        let mut ceiling = e.ceiling.clone().unwrap_or_default();
        for (k, v) in &e.ratios {
            ceiling.push_str(&format!("  [{k}: {v:.3}]"));
        }
        println!(
            "{:<32} {:>4} {:>12} {:<9} {:>7}  {}",
            e.name,
            c,
            fmt_value(e.value),
            e.unit,
            ratio,
            ceiling
        );
    }
}

/// The targets at concurrency `c`, each said met or missed.
pub(crate) fn print_targets(entries: &[Entry], c: usize) {
    let find = |name: &str| {
        entries
            .iter()
            .find(|e| e.name == name && e.concurrency == Some(c))
    };
    let ratio = |name: &str, ceiling: &str| {
        find(name).and_then(|e| e.ratios.get(ceiling).copied().or(e.ratio_to_ceiling))
    };
    let goals = [
        (
            "duplicate (cache hit) ÷ HTTP ceiling ≥ 0.6",
            ratio("duplicate_cache_hit_throughput", "http_ceiling_throughput"),
            0.6,
            true,
        ),
        (
            "duplicate (cache hit) p99 ≤ 2 ms",
            find("duplicate_cache_hit_p99").map(|e| e.value),
            2.0,
            false,
        ),
        (
            "duplicate through Redis ÷ HTTP ceiling ≥ 0.4",
            ratio("duplicate_redis_throughput", "http_ceiling_throughput"),
            0.4,
            true,
        ),
        (
            "handler CPU per duplicate (cache hit) ≤ 2× bare warp's (ratio ≥ 0.5)",
            find("duplicate_cache_hit_cpu").and_then(|e| e.ratio_to_ceiling),
            0.5,
            true,
        ),
        (
            "handler CPU per duplicate with an OTLP exporter ≤ 1.10× without (median of rounds)",
            find("duplicate_otel_cpu").and_then(|e| e.ratio_to_ceiling),
            1.10,
            false,
        ),
    ];
    println!("\ntargets at c={c}:");
    for (goal, value, bound, at_least) in goals {
        let verdict = match value {
            Some(v) if (at_least && v >= bound) || (!at_least && v <= bound) => "met",
            Some(_) => "MISSED",
            None => "not measured",
        };
        let shown = value.map_or("-".into(), |v| format!("{v:.3}"));
        println!("  {verdict:<12} {goal}: {shown}");
    }
}

pub(crate) fn fmt_value(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}
