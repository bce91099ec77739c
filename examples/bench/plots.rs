//! Latency plots (PNG) of each path beside its ceilings.

use super::*;

/// One latency-by-percentile curve.
pub(crate) struct Curve {
    pub(crate) label: String,
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) color: plotters::style::RGBColor,
    pub(crate) dashed: bool,
}

/// x = 1 / (1 − q): 1 at p0, 10 at p90, 100 at p99, 1000 at p99.9.
pub(crate) fn curve(
    label: String,
    s: &Series,
    color: plotters::style::RGBColor,
    dashed: bool,
    max_x: f64,
) -> Curve {
    let mut points = Vec::new();
    if let Some(h) = &s.hist {
        let steps = (max_x.log10() * 100.0) as i32;
        for k in 0..=steps {
            let x = 10f64.powf(f64::from(k) / 100.0);
            let q = 1.0 - 1.0 / x;
            points.push((x, h.value_at_quantile(q) as f64 / 1e6));
        }
    }
    Curve {
        label,
        points,
        color,
        dashed,
    }
}

pub(crate) fn plot(path: &Path, title: &str, curves: &[Curve], max_x: f64) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let (mut lo, mut hi) = (f64::MAX, 0f64);
    for c in curves {
        for &(_, y) in &c.points {
            lo = lo.min(y);
            hi = hi.max(y);
        }
    }
    if hi <= 0.0 {
        return Ok(());
    }
    let (lo, hi) = (lo.max(0.001) * 0.8, hi * 1.25);
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .margin_right(48)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((1f64..max_x).log_scale(), (lo..hi).log_scale())?;
    let percentile = |x: &f64| {
        let p = 100.0 * (1.0 - 1.0 / x);
        if p < 99.0 {
            format!("p{p:.0}")
        } else {
            format!("p{}", trim(p))
        }
    };
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&percentile)
        .y_label_formatter(&|y| trim(*y))
        .label_style(("sans-serif", 15))
        .draw()?;
    for c in curves {
        let color = c.color;
        let style = ShapeStyle::from(&color).stroke_width(if c.dashed { 1 } else { 3 });
        if c.dashed {
            chart
                .draw_series(DashedLineSeries::new(c.points.clone(), 6, 4, style))?
                .label(c.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        } else {
            chart
                .draw_series(LineSeries::new(c.points.clone(), style))?
                .label(c.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

pub(crate) fn trim(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}
