//! Line charts as inline SVG, drawn on the server: one x step per request, any number of series.
//! Colours are presentation attributes (the pages' content policy allows no inline style).

use std::fmt::Write;

use super::html::{esc, num};

/// One line of a chart.
pub struct Series<'a> {
    pub label: &'a str,
    pub colour: &'a str,
    /// Dashed: a limit rather than a measurement.
    pub dashed: bool,
    pub values: Vec<f64>,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 40.0;

/// A chart of `series` against the request number, titled `title`, y values shown by `label_of`,
/// the y axis up to `fixed_top` (100 for a percentage; 0: a little above the largest value). `id`
/// names the SVG element (tests and links find it by it).
pub fn chart(id: &str, title: &str, series: &[Series], fixed_top: f64, label_of: impl Fn(f64) -> String) -> String {
    let points = series.iter().map(|s| s.values.len()).max().unwrap_or(0);
    let top = series.iter().flat_map(|s| s.values.iter().copied()).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let top = match (fixed_top > 0.0, top > 0.0) {
        (true, _) => fixed_top,
        (false, true) => top * 1.05,
        (false, false) => 1.0,
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| LEFT + if points > 1 { plot_w * i as f64 / (points - 1) as f64 } else { plot_w / 2.0 };
    let y = |v: f64| TOP + plot_h * (1.0 - (v / top).clamp(0.0, 1.0));
    let mut svg = String::with_capacity(1024 + points * series.len() * 16);
    let _ = write!(
        svg,
        "<figure class=\"chart\"><figcaption>{}</figcaption><svg id=\"{}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{}\" xmlns=\"http://www.w3.org/2000/svg\">",
        esc(title),
        esc(id),
        esc(title)
    );
    // Axes and the gridlines at a quarter, half and three quarters.
    for step in 0..=4 {
        let value = top * f64::from(step) / 4.0;
        let at = y(value);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" y1=\"{at:.1}\" x2=\"{:.1}\" y2=\"{at:.1}\" stroke=\"#ddd\" stroke-width=\"1\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            at + 4.0,
            esc(&label_of(value))
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">request 1 … {}</text>",
        LEFT + plot_w / 2.0,
        HEIGHT - BOTTOM + 16.0,
        num(points as u64)
    );
    for (n, line) in series.iter().enumerate() {
        if line.values.is_empty() {
            continue;
        }
        let dash = if line.dashed { " stroke-dasharray=\"6 4\"" } else { "" };
        let mut path = String::with_capacity(line.values.len() * 14);
        for (i, value) in line.values.iter().enumerate() {
            let _ = write!(path, "{}{:.1},{:.1}", if i == 0 { "" } else { " " }, x(i), y(*value));
        }
        let _ = write!(
            svg,
            "<polyline class=\"series\" data-label=\"{}\" points=\"{path}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash}/>",
            esc(line.label),
            esc(line.colour)
        );
        if line.values.len() == 1 {
            let _ = write!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{}\"/>",
                x(0),
                y(line.values[0]),
                esc(line.colour)
            );
        }
        // The legend, along the bottom.
        let lx = LEFT + n as f64 * 170.0;
        let ly = HEIGHT - 8.0;
        let _ = write!(
            svg,
            "<line x1=\"{lx:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{}\" stroke-width=\"2\"{dash}/><text x=\"{:.1}\" y=\"{ly:.1}\" font-size=\"11\" fill=\"#333\">{}</text>",
            ly - 4.0,
            lx + 18.0,
            ly - 4.0,
            esc(line.colour),
            lx + 22.0,
            esc(line.label)
        );
    }
    svg.push_str("</svg></figure>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_one_polyline_per_series_with_every_point() {
        let series = [
            Series { label: "sent", colour: "#c33", dashed: false, values: vec![10.0, 20.0, 30.0] },
            Series { label: "<window>", colour: "#333", dashed: true, values: vec![40.0, 40.0, 40.0] },
        ];
        let svg = chart("tokens", "Tokens", &series, 0.0, |v| format!("{v:.0}"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("&lt;window&gt;") && !svg.contains("<window>"));
        let first = svg.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
        assert_eq!(first.split(' ').count(), 3, "{first}");
    }
}
