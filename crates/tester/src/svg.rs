//! A small SVG writer for the tester's plots: lines with markers over a
//! linear or logarithmic x axis, a linear y axis from zero, and a legend.
//! No plotting library: the output is plain SVG 1.1 any browser shows.

use std::fmt::Write;

const W: f64 = 860.0;
const H: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    /// The y axis's top; None: a round number above the highest point.
    pub y_max: Option<f64>,
    pub series: Vec<Series>,
}

impl Plot {
    pub fn to_svg(&self) -> String {
        let pts = || self.series.iter().flat_map(|s| s.points.iter().copied()).filter(|&(x, y)| x.is_finite() && y.is_finite() && (!self.x_log || x > 0.0));
        let (mut x0, mut x1) = pts().fold((f64::MAX, f64::MIN), |(a, b), (x, _)| (a.min(x), b.max(x)));
        let y1 = pts().fold(0.0f64, |m, (_, y)| m.max(y)) * 1.1;
        if x0 > x1 {
            (x0, x1) = (1.0, 10.0);
        }
        let axis = Axis::new(x0, x1, self.x_log);
        let ymax = self.y_max.unwrap_or(if y1 > 0.0 { nice_ceiling(y1) } else { 1.0 });
        let px = |x: f64| LEFT + axis.fraction(x) * (W - LEFT - RIGHT);
        let py = |y: f64| H - BOTTOM - y / ymax * (H - TOP - BOTTOM);
        let mut out = String::new();
        let _ = write!(out, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#);
        let _ = write!(out, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = write!(out, r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#, (LEFT + W - RIGHT) / 2.0, escape(&self.title));
        let _ = write!(out, r#"<line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, H - BOTTOM, W - RIGHT, H - BOTTOM);
        let _ = write!(out, r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}" stroke="black"/>"#, H - BOTTOM);
        for x in axis.ticks() {
            let _ = write!(out, r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#, px(x), H - BOTTOM + 16.0, label(x));
        }
        for i in 0..=5 {
            let y = ymax * f64::from(i) / 5.0;
            let _ = write!(out, r##"<line x1="{LEFT}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="#ddd"/>"##, py(y), W - RIGHT, py(y));
            let _ = write!(out, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, py(y) + 4.0, label(y));
        }
        let _ = write!(out, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, (LEFT + W - RIGHT) / 2.0, H - 18.0, escape(&self.x_label));
        let ymid = (TOP + H - BOTTOM) / 2.0;
        let _ = write!(out, r#"<text x="18" y="{ymid}" transform="rotate(-90 18 {ymid})" text-anchor="middle">{}</text>"#, escape(&self.y_label));
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let shown: Vec<(f64, f64)> = s.points.iter().copied().filter(|&(x, y)| x.is_finite() && y.is_finite() && (!self.x_log || x > 0.0)).collect();
            let line: Vec<String> = shown.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
            let _ = write!(out, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, line.join(" "));
            if shown.len() <= 60 {
                for &(x, y) in &shown {
                    let _ = write!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, px(x), py(y));
                }
            }
            let ly = TOP + 10.0 + 20.0 * i as f64;
            let _ = write!(out, r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/>"#, W - RIGHT + 15.0, W - RIGHT + 40.0);
            let _ = write!(out, r#"<text x="{}" y="{}">{}</text>"#, W - RIGHT + 46.0, ly + 4.0, escape(&s.name));
        }
        out.push_str("</svg>\n");
        out
    }
}

/// Where an x value falls between the axis ends, 0 to 1.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn new(x0: f64, x1: f64, log: bool) -> Axis {
        if log {
            let (lo, hi) = (x0.log10().floor(), x1.log10().ceil());
            Axis { lo, hi: if hi > lo { hi } else { lo + 1.0 }, log }
        } else {
            let hi = nice_ceiling(x1);
            Axis { lo: 0.0f64.min(x0), hi: if hi > 0.0 { hi } else { 1.0 }, log }
        }
    }

    fn fraction(&self, x: f64) -> f64 {
        let v = if self.log { x.log10() } else { x };
        (v - self.lo) / (self.hi - self.lo)
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            (self.lo as i32..=self.hi as i32).map(|e| 10f64.powi(e)).collect()
        } else {
            (0..=5).map(|i| self.lo + (self.hi - self.lo) * f64::from(i) / 5.0).collect()
        }
    }
}

/// The smallest of 1, 2, 2.5, 5 times a power of ten at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].into_iter().map(|m| m * p).find(|&c| c >= v).unwrap_or(10.0 * p)
}

fn label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plot(x_log: bool) -> Plot {
        Plot {
            title: "rate <against> flows & more".into(),
            x_label: "flows".into(),
            y_label: "kpps".into(),
            x_log,
            y_max: None,
            series: vec![Series { name: "natrix".into(), points: vec![(1000.0, 120.0), (2000.0, 118.0), (1e6, 20.0)] }, Series { name: "kernel".into(), points: vec![] }],
        }
    }

    #[test]
    fn svg_is_one_element_with_escaped_text() {
        for log in [false, true] {
            let s = plot(log).to_svg();
            assert!(s.starts_with("<svg ") && s.trim_end().ends_with("</svg>"));
            assert!(s.contains("rate &lt;against&gt; flows &amp; more"));
            assert_eq!(s.matches("<polyline").count(), 2);
            assert_eq!(s.matches("<circle").count(), 3);
        }
    }

    #[test]
    fn log_axes_tick_at_decades() {
        let a = Axis::new(1000.0, 1e6, true);
        assert_eq!(a.ticks(), vec![1e3, 1e4, 1e5, 1e6]);
        assert_eq!(a.fraction(1e3), 0.0);
        assert_eq!(a.fraction(1e6), 1.0);
    }

    #[test]
    fn nice_numbers_and_labels() {
        assert_eq!(nice_ceiling(132.0), 200.0);
        assert_eq!(nice_ceiling(0.9), 1.0);
        assert_eq!(nice_ceiling(240.0), 250.0);
        assert_eq!(label(262_144.0), "262.14k");
        assert_eq!(label(2e6), "2M");
        assert_eq!(label(12.5), "12.5");
    }

    #[test]
    fn an_empty_plot_still_draws() {
        let p = Plot { series: vec![], ..plot(true) };
        assert!(p.to_svg().contains("</svg>"));
    }
}
