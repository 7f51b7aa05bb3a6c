//! Stacked bar charts as inline SVG: one bar per day, one colour per model, a y axis with
//! rounded ticks, day labels, and a legend. No script, so they render in any browser and in
//! screenshots.

use maud::{html, Markup};

use super::layout::thousands;

const WIDTH: u64 = 720;
const HEIGHT: u64 = 260;
const LEFT: u64 = 72;
const RIGHT: u64 = 12;
const TOP: u64 = 12;
const BOTTOM: u64 = 36;
const TICKS: u64 = 4;
const MAX_DAY_LABELS: usize = 8;
pub const PALETTE: [&str; 8] = [
    "#4f46e5", "#0891b2", "#16a34a", "#d97706", "#db2777", "#7c3aed", "#64748b", "#dc2626",
];

/// The data of one chart: a value per (day, series).
pub struct Stacked<'a> {
    pub id: &'a str,
    pub title: &'a str,
    pub unit: &'a str,
    /// X labels, one per bar.
    pub days: &'a [String],
    /// Series names, in legend order.
    pub series: &'a [String],
    /// `values[day][series]`.
    pub values: &'a [Vec<u64>],
}

/// A bar's x, its segments (top, height, colour, tooltip) and its day label if shown.
type Bar = (f64, Vec<(f64, f64, &'static str, String)>, Option<String>);

/// The smallest 1, 2, 2.5 or 5 times a power of ten that is at least `n / TICKS`, times TICKS.
fn axis_max(n: u64) -> u64 {
    let raw = n.div_ceil(TICKS).max(1);
    let mut power = 1;
    while power * 10 <= raw {
        power *= 10;
    }
    let step = [2, 4, 5, 10, 20]
        .into_iter()
        .map(|halves| halves * power / 2)
        .find(|s| *s >= raw)
        .unwrap_or(raw);
    step * TICKS
}

fn short(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 100_000 == 0 => {
            format!("{}.{}M", n / 1_000_000, n % 1_000_000 / 100_000).replace(".0M", "M")
        }
        n if n >= 10_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => thousands(n),
    }
}

pub fn stacked(chart: &Stacked<'_>) -> Markup {
    let totals: Vec<u64> = chart.values.iter().map(|v| v.iter().sum()).collect();
    let max = axis_max(totals.iter().copied().max().unwrap_or(0));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let n = chart.days.len().max(1) as u64;
    let slot = plot_w as f64 / n as f64;
    let bar = (slot * 0.7).max(1.0);
    let y = |v: u64| TOP as f64 + plot_h as f64 * (1.0 - v as f64 / max as f64);
    let label_every = chart.days.len().div_ceil(MAX_DAY_LABELS).max(1);
    let title_id = format!("{}-title", chart.id);
    let bars: Vec<Bar> = chart
        .days
        .iter()
        .enumerate()
        .map(|(d, day)| {
            let x = LEFT as f64 + slot * d as f64 + (slot - bar) / 2.0;
            let mut base = 0u64;
            let mut segments = Vec::new();
            for (s, value) in chart.values[d].iter().enumerate().filter(|(_, v)| **v > 0) {
                let top = y(base + value);
                segments.push((
                    top,
                    y(base) - top,
                    PALETTE[s % PALETTE.len()],
                    format!(
                        "{day} · {}: {} {}",
                        chart.series[s],
                        thousands(*value),
                        chart.unit
                    ),
                ));
                base += value;
            }
            let label = (d % label_every == 0).then(|| day.get(5..).unwrap_or(day).to_owned());
            (x, segments, label)
        })
        .collect();
    html! {
        figure.chart {
            svg #(chart.id) viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-labelledby=(title_id) preserveAspectRatio="xMidYMid meet" {
                title #(title_id) { (chart.title) " by day and model (" (chart.unit) ")" }
                @for i in 0..=TICKS {
                    @let v = max / TICKS * i;
                    line.grid x1=(LEFT) x2=(WIDTH - RIGHT) y1=(y(v)) y2=(y(v)) {}
                    text.tick x=(LEFT - 8) y=(y(v) + 4.0) text-anchor="end" { (short(v)) }
                }
                line.axis x1=(LEFT) x2=(LEFT) y1=(TOP) y2=(TOP + plot_h) {}
                line.axis x1=(LEFT) x2=(WIDTH - RIGHT) y1=(TOP + plot_h) y2=(TOP + plot_h) {}
                text.axis-label x="14" y=(TOP as f64 + plot_h as f64 / 2.0) transform=(format!("rotate(-90 14 {})", TOP as f64 + plot_h as f64 / 2.0)) text-anchor="middle" { (chart.unit) }
                @for (x, segments, label) in &bars {
                    @for (top, height, color, tip) in segments {
                        rect x=(x) y=(top) width=(bar) height=(height) fill=(color) { title { (tip) } }
                    }
                    @if let Some(label) = label {
                        text.tick x=(x + bar / 2.0) y=(HEIGHT - BOTTOM + 18) text-anchor="middle" { (label) }
                    }
                }
            }
            figcaption {
                ul.legend aria-label="Legend" {
                    @for (s, name) in chart.series.iter().enumerate() {
                        li { span.swatch style=(format!("background:{}", PALETTE[s % PALETTE.len()])) aria-hidden="true" {} (name) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_axis_ends_on_a_round_number_at_or_above_the_tallest_bar() {
        assert_eq!(axis_max(0), 4);
        assert_eq!(axis_max(7), 8);
        assert_eq!(axis_max(93), 100);
        assert_eq!(axis_max(1_234), 2_000);
        assert_eq!(axis_max(400_000), 400_000);
    }

    #[test]
    fn chart_has_a_title_axes_ticks_and_a_legend_entry_per_model() {
        let days = vec!["2026-11-22".to_owned(), "2026-11-23".to_owned()];
        let series = vec!["svc/opus".to_owned(), "svc/haiku".to_owned()];
        let values = vec![vec![0, 0], vec![300, 100]];
        let svg = stacked(&Stacked {
            id: "c",
            title: "Credits",
            unit: "credits",
            days: &days,
            series: &series,
            values: &values,
        })
        .into_string();
        assert!(svg.contains("<title id=\"c-title\">Credits by day and model (credits)</title>"));
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("11-23"));
        assert!(svg.contains(">400<"));
        assert!(svg.contains("svc/opus") && svg.contains("svc/haiku"));
    }
}
