//! Charts drawn on the server as inline SVG (no script, no library, nothing from elsewhere):
//! uses per day stacked by source, and a skill's uses per day as a line. Colours come from
//! the stylesheet's classes (the CSP allows no inline style); each day's numbers are in its
//! bar's title (on hover) and the period's in the chart's label, and [`days_table`] gives
//! every day's as a table for a screen reader or a keyboard.

use cloud_harness_control::skill_usage::report::Total;
use maud::{html, Markup};

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 180.0;
/// Room for the axis labels: left, bottom, top.
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 22.0;
const TOP: f64 = 8.0;

/// The sources in the order they are stacked (bottom first), with their names for people.
pub const SOURCES: [(&str, &str); 4] = [
    ("read", "reads"),
    ("resource", "resource reads"),
    ("mount", "mount loads"),
    ("run", "runs"),
];

fn uses(day: &Total, source: &str) -> i64 {
    day.uses.get(source).copied().unwrap_or(0).max(0)
}

fn total(day: &Total) -> i64 {
    SOURCES.iter().map(|(s, _)| uses(day, s)).sum()
}

/// The smallest of 1, 2, 5 × 10ⁿ at least `n`: the top of the scale.
fn nice_ceiling(n: i64) -> i64 {
    let mut step = 1_i64;
    loop {
        for m in [1, 2, 5] {
            if m * step >= n {
                return m * step;
            }
        }
        match step.checked_mul(10) {
            Some(s) => step = s,
            None => return n,
        }
    }
}

/// One sentence per day: its uses by source.
fn said(day: &Total) -> String {
    let parts: Vec<String> = SOURCES
        .iter()
        .map(|(s, name)| format!("{} {name}", uses(day, s)))
        .collect();
    format!("{}: {}", day.day, parts.join(", "))
}

/// Uses per day over the period, stacked by source, with a legend.
pub fn days(days: &[Total]) -> Markup {
    let highest = days.iter().map(total).max().unwrap_or(0);
    let top = nice_ceiling(highest.max(1));
    let plot_w = WIDTH - LEFT;
    let plot_h = HEIGHT - BOTTOM - TOP;
    let band = plot_w / days.len().max(1) as f64;
    let bar = (band * 0.8).max(0.5);
    let sum = |s: &str| days.iter().map(|d| uses(d, s)).sum::<i64>();
    let label = format!(
        "Uses per day from {} to {}: {}",
        days.first().map_or("", |d| d.day.as_str()),
        days.last().map_or("", |d| d.day.as_str()),
        SOURCES
            .iter()
            .map(|(s, name)| format!("{} {name}", sum(s)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    html! {
        figure.chart {
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img" aria-label=(label) {
                line.axis x1=(LEFT) y1=(TOP + plot_h) x2=(WIDTH) y2=(TOP + plot_h) {}
                line.grid x1=(LEFT) y1=(TOP) x2=(WIDTH) y2=(TOP) {}
                text.tick x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" { (top) }
                text.tick x=(LEFT - 6.0) y=(TOP + plot_h) text-anchor="end" { "0" }
                @for (i, day) in days.iter().enumerate() {
                    @let x = LEFT + i as f64 * band + (band - bar) / 2.0;
                    g.day {
                        title { (said(day)) }
                        // Stacked from the axis up; a day without a use still has its
                        // band, for its title.
                        rect.band x=(LEFT + i as f64 * band) y=(TOP) width=(band) height=(plot_h) {}
                        @let mut base = TOP + plot_h;
                        @for (source, _) in SOURCES {
                            @let h = uses(day, source) as f64 / top as f64 * plot_h;
                            @if h > 0.0 {
                                @let y = { base -= h; base };
                                rect class=(source) x=(fmt(x)) y=(fmt(y)) width=(fmt(bar)) height=(fmt(h)) {}
                            }
                        }
                    }
                }
                @if let (Some(first), Some(last)) = (days.first(), days.last()) {
                    text.tick x=(LEFT) y=(HEIGHT - 6.0) text-anchor="start" { (first.day) }
                    text.tick x=(WIDTH) y=(HEIGHT - 6.0) text-anchor="end" { (last.day) }
                }
            }
            figcaption {
                ul.legend {
                    @for (source, name) in SOURCES {
                        li { span class={ "swatch " (source) } aria-hidden="true" {} (sum(source)) " " (name) }
                    }
                }
            }
        }
    }
}

/// The most points a sparkline has: over a longer period, each point sums a few days.
const SPARK_POINTS: usize = 60;

/// A skill's uses per day over the period as a line (its numbers are in its row), a point
/// for each day, or for each few days over a long period.
pub fn sparkline(period: &[String], per_day: &[(String, i64)]) -> Markup {
    const W: f64 = 120.0;
    const H: f64 = 24.0;
    let daily: Vec<i64> = period
        .iter()
        .map(|d| {
            per_day
                .binary_search_by(|(day, _)| day.as_str().cmp(d))
                .map_or(0, |at| per_day[at].1.max(0))
        })
        .collect();
    let size = daily.len().div_ceil(SPARK_POINTS).max(1);
    let values: Vec<i64> = daily
        .chunks(size)
        .map(|c| c.iter().fold(0_i64, |a, v| a.saturating_add(*v)))
        .collect();
    let top = values.iter().copied().max().unwrap_or(0).max(1) as f64;
    let step = W / (values.len().max(2) - 1) as f64;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let x = i as f64 * step;
            let y = H - 2.0 - (*v as f64 / top) * (H - 4.0);
            format!("{},{}", fmt(x), fmt(y))
        })
        .collect();
    html! {
        svg.spark viewBox={ "0 0 " (W) " " (H) } aria-hidden="true" {
            polyline points=(points.join(" ")) {}
        }
    }
}

/// The days with a use as a table, folded away: what the chart shows, for a screen reader
/// or a keyboard.
pub fn days_table(days: &[Total]) -> Markup {
    let used: Vec<&Total> = days.iter().filter(|d| total(d) > 0).collect();
    html! {
        details.days {
            summary { "The days with a use, as a table (" (used.len()) ")" }
            table { thead { tr {
                th scope="col" { "Day" }
                @for (_, name) in SOURCES { th scope="col" { (name) } }
                th scope="col" { "failed runs" }
            } }
                tbody { @for d in &used { tr {
                    th scope="row" { (d.day) }
                    @for (source, _) in SOURCES { td.n { (uses(d, source)) } }
                    td.n { (d.run_failures) }
                } } }
            }
        }
    }
}

/// A coordinate, short.
fn fmt(v: f64) -> String {
    format!("{:.1}", v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn day(d: &str, read: i64, run: i64) -> Total {
        Total {
            day: d.to_owned(),
            uses: BTreeMap::from([("read", read), ("run", run), ("mount", 0), ("resource", 0)]),
            run_failures: 0,
        }
    }

    #[test]
    fn the_scale_tops_at_one_two_or_five_times_a_power_of_ten() {
        let tops: Vec<i64> = [1, 2, 3, 7, 10, 11, 99, 101, 4999]
            .into_iter()
            .map(nice_ceiling)
            .collect();
        assert_eq!(tops, [1, 2, 5, 10, 10, 20, 100, 200, 5000]);
        assert_eq!(nice_ceiling(i64::MAX), i64::MAX);
    }

    #[test]
    fn each_day_is_a_stack_of_its_sources_with_its_numbers_in_a_title() {
        let svg = days(&[day("2026-12-06", 0, 0), day("2026-12-07", 4, 2)]).into_string();
        assert!(svg.contains("aria-label=\"Uses per day from 2026-12-06 to 2026-12-07: 4 reads, 0 resource reads, 0 mount loads, 2 runs\""), "{svg}");
        assert!(
            svg.contains(
                "<title>2026-12-07: 4 reads, 0 resource reads, 0 mount loads, 2 runs</title>"
            ),
            "{svg}"
        );
        // Two bars on the busy day, none on the quiet one; the scale's top is 10 (6 uses).
        assert_eq!(svg.matches("<rect class=\"read\"").count(), 1, "{svg}");
        assert_eq!(svg.matches("<rect class=\"run\"").count(), 1, "{svg}");
        assert!(svg.contains(">10</text>"), "{svg}");
        // The read bar is 4/10 of the plot's 150 units, the run bar on top of it 2/10.
        assert!(
            svg.contains("class=\"read\" x=\"") && svg.contains("height=\"60.0\""),
            "{svg}"
        );
        assert!(svg.contains("height=\"30.0\""), "{svg}");
        assert!(!svg.contains("style="), "{svg}");
    }

    #[test]
    fn a_long_period_has_a_point_per_few_days() {
        let period: Vec<String> = (0..400).map(|i| format!("d{i:03}")).collect();
        let svg = sparkline(&period, &[("d399".into(), 5)]).into_string();
        let points = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(points.split(' ').count(), 58, "{svg}");
        assert!(points.ends_with("120.0,2.0"), "{svg}");
    }

    #[test]
    fn a_sparkline_has_a_point_per_day_of_the_period() {
        let period: Vec<String> = ["2026-12-05", "2026-12-06", "2026-12-07"]
            .map(String::from)
            .to_vec();
        let svg = sparkline(&period, &[("2026-12-07".into(), 3)]).into_string();
        assert!(
            svg.contains("points=\"0.0,22.0 60.0,22.0 120.0,2.0\""),
            "{svg}"
        );
    }
}
