//! Line plots as SVG, small enough to write by hand: a logarithmic x axis (a count of
//! things, 10 to 1,000), a linear y axis from 0, one line per series with its points marked.

use std::fmt::Write;

const W: f64 = 560.0;
const H: f64 = 320.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 46.0;
const COLOURS: [&str; 6] = [
    "#1f5fa8", "#c0392b", "#2e8b57", "#8e44ad", "#d35400", "#5d6d7e",
];

pub struct Series<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `max`.
fn ceiling(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|v| *v >= max)
        .unwrap_or(10.0 * power)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG text of one plot.
pub fn svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| *x > 0.0)
        .collect();
    let x_min = xs.iter().cloned().fold(f64::INFINITY, f64::min).max(1.0);
    let x_max = xs.iter().cloned().fold(1.0, f64::max).max(x_min * 10.0);
    let (lo, hi) = (x_min.log10().floor(), x_max.log10().ceil());
    let y_max = ceiling(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max),
    );
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |x: f64| LEFT + (x.max(1.0).log10() - lo) / (hi - lo).max(1.0) * pw;
    let py = |y: f64| TOP + ph - y / y_max * ph;
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="#fff"/><text x="{LEFT}" y="20" font-size="14" font-weight="bold">{}</text>"##,
        escape(title)
    );
    for i in 0..=4 {
        let y = y_max * i as f64 / 4.0;
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{yp:.1}" y2="{yp:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            py(y) + 4.0,
            short(y),
            yp = py(y)
        );
    }
    let mut e = lo;
    while e <= hi {
        let x = px(10f64.powf(e));
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            short(10f64.powf(e))
        );
        e += 1.0;
    }
    let _ = write!(
        out,
        r##"<text x="{:.1}" y="{}" text-anchor="middle">{}</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
        LEFT + pw / 2.0,
        H - 8.0,
        escape(x_label),
        TOP + ph / 2.0,
        escape(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = s
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = write!(
            out,
            r##"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"##,
            points.join(" ")
        );
        for (x, y) in &s.points {
            let _ = write!(
                out,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"/>"##,
                px(*x),
                py(*y)
            );
        }
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let _ = write!(
            out,
            r##"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{}</text>"##,
            LEFT + pw + 10.0,
            LEFT + pw + 28.0,
            LEFT + pw + 32.0,
            ly + 4.0,
            escape(s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// A tick label: whole numbers as they are, thousands as `k`.
fn short(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{}k", (v / 1000.0).round())
    } else if v.fract() == 0.0 {
        format!("{v}")
    } else {
        format!("{v:.2}")
    }
}
