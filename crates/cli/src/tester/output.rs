//! What `natrix test` leaves behind: result lines on stdout (a table, or
//! JSON lines with --json) and in `results.jsonl`, the plots, and with
//! both devices measured, the side-by-side table in `side-by-side.md`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use natrix_tester::report::{self, Criterion, Line};
use natrix_tester::stats;
use natrix_tester::svg::{Plot, Series};
use serde_json::Value;

use crate::Failure;

pub struct Output {
    json: bool,
    header_printed: bool,
    file: BufWriter<File>,
    pub lines: Vec<Line>,
}

impl Output {
    pub fn create(json: bool, dir: &Path) -> Result<Output, Failure> {
        let path = dir.join("results.jsonl");
        let file = File::create(&path).map_err(|e| Failure::Other(format!("{}: {e}", path.display())))?;
        Ok(Output { json, header_printed: false, file: BufWriter::new(file), lines: Vec::new() })
    }

    pub fn emit(&mut self, line: Line) {
        let json = line.to_json().to_string();
        if self.json {
            println!("{json}");
        } else {
            if !self.header_printed {
                println!("{}", report::header());
                self.header_printed = true;
            }
            println!("{}", line.row());
        }
        let _ = writeln!(self.file, "{json}");
        let _ = self.file.flush();
        self.lines.push(line);
    }
}

/// Per device: the capacity search's points and each size's latencies.
#[derive(Default)]
pub struct PlotData {
    pub capacity: Vec<(String, Vec<(u64, f64)>)>,
    pub latencies: Vec<(String, usize, Vec<u32>)>,
}

/// Writes rate-vs-flows.svg and latency.svg into `dir`; returns their paths.
pub fn write_plots(dir: &Path, data: &PlotData) -> Result<Vec<PathBuf>, Failure> {
    let rate = Plot {
        title: "RFC 9693: maximum connection establishment rate against connections".into(),
        x_label: "connections in the table (log scale)".into(),
        y_label: "connections per second (k)".into(),
        x_log: true,
        y_max: None,
        series: data
            .capacity
            .iter()
            .map(|(dut, points)| {
                let mut p: Vec<(f64, f64)> = points.iter().map(|&(flows, r)| (flows as f64, r / 1e3)).collect();
                p.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { name: dut.clone(), points: p }
            })
            .collect(),
    };
    let latency = Plot {
        title: "RFC 8219 latency at the throughput rate: cumulative distribution".into(),
        x_label: "latency, microseconds (log scale)".into(),
        y_label: "share of frames at or below".into(),
        x_log: true,
        y_max: Some(1.0),
        series: data
            .latencies
            .iter()
            .map(|(dut, size, sorted)| Series { name: format!("{dut}, {size} B"), points: stats::cdf(sorted, 400).into_iter().map(|(ns, p)| (ns / 1e3, p)).collect() })
            .collect(),
    };
    let mut written = Vec::new();
    for (name, plot) in [("rate-vs-flows.svg", rate), ("latency.svg", latency)] {
        let path = dir.join(name);
        std::fs::write(&path, plot.to_svg()).map_err(|e| Failure::Other(format!("{}: {e}", path.display())))?;
        written.push(path);
    }
    Ok(written)
}

/// One row of the side-by-side table: what, natrix's figure, the kernel's.
struct Row {
    what: String,
    natrix: Option<Cell>,
    kernel: Option<Cell>,
    unit: &'static str,
    /// Lower is better (latency, CPU): the ratio is inverted so that above
    /// 1 always means natrix does better.
    lower_better: bool,
}

/// One device's figure in a row: the value, whether it was the tester's
/// limit, and for latency and PDV the rate it was measured at (each
/// device's own throughput, RFC 8219).
#[derive(Clone, Copy)]
struct Cell {
    value: f64,
    limited: bool,
    at_pps: Option<f64>,
}

/// The side-by-side table (markdown) of natrix and the kernel from the
/// same run, with natrix/kernel ratios; None unless both were measured.
pub fn side_by_side(lines: &[Line]) -> Option<String> {
    let has = |dut: &str| lines.iter().any(|l| l.dut == dut);
    if !has("natrix") || !has("kernel") {
        return None;
    }
    let pick = |dut: &str, test: &str, size: Option<usize>, field: &str| -> Option<Cell> {
        lines.iter().filter(|l| l.dut == dut && l.test == test && size.is_none_or(|s| l.frame_size == s)).find_map(|l| {
            let value = l.result.get(field).and_then(Value::as_f64)?;
            let at_pps = matches!(test, "latency" | "pdv").then(|| l.result.get("rate_pps").and_then(Value::as_f64)).flatten();
            Some(Cell { value, limited: l.generator_limited, at_pps })
        })
    };
    let mut rows = Vec::new();
    let mut add = |what: String, test: &str, size: Option<usize>, field: &str, unit: &'static str, lower_better: bool| {
        rows.push(Row { what, natrix: pick("natrix", test, size, field), kernel: pick("kernel", test, size, field), unit, lower_better });
    };
    add("TCP throughput, iperf3 (Gbit/s)".into(), "tcp_throughput", None, "gbps", "Gbit/s", false);
    add("CPU per forwarded TCP frame: the device's CPUs".into(), "tcp_throughput", None, "dut_ns_per_frame", "ns", true);
    add("maximum connection establishment rate (RFC 9693)".into(), "connection_rate", None, "rate_pps", "conn/s", false);
    add("connection tear-down rate (RFC 9693)".into(), "teardown_rate", None, "rate_cps", "conn/s", false);
    add("connection tracking table capacity (RFC 9693)".into(), "table_capacity", None, "flows", "conns", false);
    let mut sizes: Vec<usize> = lines.iter().filter(|l| l.test == "throughput").map(|l| l.frame_size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        // The loss the throughput was searched with (--loss): zero is RFC 2544's.
        let loss = match lines.iter().find(|l| l.test == "throughput" && l.frame_size == size).map(|l| l.criterion) {
            Some(Criterion::Fraction(f)) => format!("{}% loss", f * 100.0),
            _ => "zero loss".to_owned(),
        };
        add(format!("throughput, {size} B, {loss} (RFC 2544)"), "throughput", Some(size), "rate_pps", "fps", false);
        add(format!("latency, {size} B, median (RFC 8219)"), "latency", Some(size), "median_us", "us", true);
        add(format!("latency, {size} B, 99.9th percentile (RFC 8219)"), "latency", Some(size), "p999_us", "us", true);
        add(format!("PDV, {size} B (RFC 8219)"), "pdv", Some(size), "pdv_us", "us", true);
    }
    add("CPU per forwarded frame: natrix's process and receive work, the kernel's CPUs".into(), "cpu", None, "dut_ns_per_frame", "ns", true);
    add("CPU per forwarded frame, working: natrix's rounds with frames and receive work, the kernel's CPUs".into(), "cpu", None, "dut_work_ns_per_frame", "ns", true);
    let mut md = String::from("| metric | natrix | kernel | natrix/kernel |\n|---|---:|---:|---:|\n");
    for r in rows.iter().filter(|r| r.natrix.is_some() || r.kernel.is_some()) {
        let ratio = match (r.natrix.map(|c| c.value), r.kernel.map(|c| c.value)) {
            (Some(n), Some(k)) if n > 0.0 && k > 0.0 => format!("{:.2}", if r.lower_better { k / n } else { n / k }),
            _ => "-".into(),
        };
        md.push_str(&format!("| {} | {} | {} | {ratio} |\n", r.what, cell(r.natrix, r.unit), cell(r.kernel, r.unit)));
    }
    md.push_str("\nRatios above 1 favour natrix (for latency, PDV and CPU the kernel's figure over natrix's). ");
    md.push_str("G: the tester's limit, not the device's (`generator_limited`): the device may do more. ");
    md.push_str("Latency and PDV are each device's at the rate shown, its own throughput (RFC 8219).\n");
    Some(md)
}

fn cell(c: Option<Cell>, unit: &str) -> String {
    let Some(c) = c else { return "-".into() };
    let mut s = figure(Some(c.value), unit);
    if let Some(at) = c.at_pps {
        s.push_str(&format!(" at {}", figure(Some(at), "fps")));
    }
    if c.limited {
        s.push_str(" (G)");
    }
    s
}

fn figure(v: Option<f64>, unit: &str) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 1e6 => format!("{:.2} M {unit}", v / 1e6),
        Some(v) if v >= 1e4 => format!("{:.1} k {unit}", v / 1e3),
        Some(v) => format!("{v:.1} {unit}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use natrix_tester::report::object;
    use serde_json::json;

    fn line(dut: &str, test: &'static str, field: &str, v: f64) -> Line {
        Line { test, dut: dut.into(), frame_size: 64, flows: 1000, criterion: Criterion::Zero, method: "RFC 2544", result: object([(field, json!(v))]), generator_limited: false }
    }

    #[test]
    fn side_by_side_needs_both_and_inverts_lower_is_better() {
        let natrix = [line("natrix", "throughput", "rate_pps", 300_000.0), line("natrix", "latency", "median_us", 20.0)];
        assert_eq!(side_by_side(&natrix), None);
        let both = [natrix.to_vec(), vec![line("kernel", "throughput", "rate_pps", 200_000.0), line("kernel", "latency", "median_us", 40.0)]].concat();
        let md = side_by_side(&both).unwrap();
        assert!(md.contains("| throughput, 64 B, zero loss (RFC 2544) | 300.0 k fps | 200.0 k fps | 1.50 |"), "{md}");
        assert!(md.contains("| latency, 64 B, median (RFC 8219) | 20.0 us | 40.0 us | 2.00 |"), "{md}");
    }

    #[test]
    fn side_by_side_marks_the_testers_limit_and_the_rate_of_each_latency() {
        let mut natrix = line("natrix", "connection_rate", "rate_pps", 41_800.0);
        natrix.generator_limited = true;
        let mut kernel_latency = line("kernel", "latency", "median_us", 40.0);
        kernel_latency.result.insert("rate_pps".into(), json!(51_400.0));
        let both = [natrix, line("kernel", "connection_rate", "rate_pps", 60_800.0), line("kernel", "throughput", "rate_pps", 51_400.0), kernel_latency];
        let md = side_by_side(&both).unwrap();
        assert!(md.contains("| 41.8 k conn/s (G) | 60.8 k conn/s |"), "{md}");
        assert!(md.contains("| - | 40.0 us at 51.4 k fps | - |"), "{md}");
    }

    #[test]
    fn side_by_side_names_the_loss_the_throughput_allowed() {
        let mut both = vec![line("natrix", "throughput", "rate_pps", 300_000.0), line("kernel", "throughput", "rate_pps", 200_000.0)];
        for l in &mut both {
            l.criterion = Criterion::Fraction(0.001);
        }
        let md = side_by_side(&both).unwrap();
        assert!(md.contains("| throughput, 64 B, 0.1% loss (RFC 2544) |"), "{md}");
        assert!(!md.contains("zero loss"), "{md}");
    }

    #[test]
    fn plots_are_written_as_svg() {
        let dir = std::env::temp_dir().join(format!("natrix-plots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data = PlotData { capacity: vec![("kernel".into(), vec![(1000, 1e5), (2000, 9e4)])], latencies: vec![("kernel".into(), 64, vec![1000, 2000, 3000])] };
        let files = write_plots(&dir, &data).unwrap();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
