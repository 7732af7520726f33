//! Results as the contract fixes them (CONTRACTS.md, "Tester"): one JSON
//! object per result with `test`, `dut`, `frame_size`, `flows`,
//! `criterion` and the result under the test's name, and a row of the
//! human table for each.

use serde::ser::{Serialize, Serializer};
use serde_json::{Map, Value};

/// The loss a result tolerates: none (RFC 2544's throughput) or a share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Criterion {
    Zero,
    Fraction(f64),
}

impl Criterion {
    pub fn from_fraction(f: f64) -> Criterion {
        if f <= 0.0 {
            Criterion::Zero
        } else {
            Criterion::Fraction(f)
        }
    }

    pub fn allows(&self, loss: f64) -> bool {
        match *self {
            Criterion::Zero => loss <= 0.0,
            Criterion::Fraction(f) => loss <= f,
        }
    }
}

impl Serialize for Criterion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Criterion::Zero => s.serialize_str("zero"),
            Criterion::Fraction(f) => s.serialize_f64(f),
        }
    }
}

/// One result line.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The test's name, which is also the key of its result object.
    pub test: &'static str,
    pub dut: String,
    /// RFC 2544 frame size, FCS included.
    pub frame_size: usize,
    pub flows: u64,
    pub criterion: Criterion,
    /// Whose method: "RFC 9693", "RFC 2544", "RFC 8219", "seed 002", "natrix".
    pub method: &'static str,
    pub result: Map<String, Value>,
    /// The generator, not the device, set the limit of this result.
    pub generator_limited: bool,
}

impl Line {
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("test".into(), self.test.into());
        o.insert("dut".into(), self.dut.clone().into());
        o.insert("frame_size".into(), self.frame_size.into());
        o.insert("flows".into(), self.flows.into());
        o.insert("criterion".into(), serde_json::to_value(self.criterion).unwrap_or(Value::Null));
        o.insert("method".into(), self.method.into());
        o.insert(self.test.into(), Value::Object(self.result.clone()));
        o.insert("generator_limited".into(), self.generator_limited.into());
        Value::Object(o)
    }

    /// The human table's row: test, DUT, size, flows, and what was found.
    pub fn row(&self) -> String {
        let criterion = match self.criterion {
            Criterion::Zero => "zero".to_owned(),
            Criterion::Fraction(f) => format!("{}%", f * 100.0),
        };
        let mut found = summary(self.test, &self.result);
        if self.test == "generator" {
            found = format!("{}: {found}", self.method);
        }
        if self.generator_limited {
            found.push_str(" (generator limit)");
        }
        format!("{:<16} {:<7} {:>5} {:>8} {:>6}  {found}", self.test, self.dut, self.frame_size, self.flows, criterion)
    }
}

pub fn header() -> String {
    format!("{:<16} {:<7} {:>5} {:>8} {:>6}  {}", "test", "dut", "size", "flows", "loss", "result")
}

fn num(r: &Map<String, Value>, k: &str) -> f64 {
    r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn summary(test: &str, r: &Map<String, Value>) -> String {
    let kpps = |k: &str| format!("{:.1} kpps", num(r, k) / 1e3);
    match test {
        "connection_rate" => format!("{} connections/s established", kpps("rate_pps").replace(" kpps", " k")),
        "teardown_rate" if r.get("rate_cps").is_some_and(Value::is_null) => "deleting them took no longer than deleting none (too few to time)".into(),
        "teardown_rate" => format!("{:.1} k connections/s deleted", num(r, "rate_cps") / 1e3),
        "table_capacity" => {
            let at_least = if r.get("at_least").and_then(Value::as_bool) == Some(true) { ">= " } else { "" };
            format!("{at_least}{} connections, at {}", num(r, "flows"), kpps("rate_pps"))
        }
        "throughput" => format!("{} (offered {}, received {})", kpps("rate_pps"), kpps("offered_pps"), kpps("received_pps")),
        "frame_loss" => format!("{:.3}% lost at {} offered", num(r, "loss") * 100.0, kpps("offered_pps")),
        "latency" => format!("median {:.1} us, 99.9th {:.1} us at {}", num(r, "median_us"), num(r, "p999_us"), kpps("rate_pps")),
        "pdv" => format!("{:.1} us at {}", num(r, "pdv_us"), kpps("rate_pps")),
        "goodput" => format!(
            "{:.2} of {:.2} Mbit/s, RTT {:.3} ms, jitter {:.3} ms, loss {:.3}%",
            num(r, "goodput_mbps"),
            num(r, "offered_mbps"),
            num(r, "rtt_ms"),
            num(r, "jitter_ms"),
            num(r, "loss") * 100.0
        ),
        "cpu" => {
            format!("{:.0} ns of the device's CPU per forwarded frame ({:.0} ns machine-wide) at {}", num(r, "dut_ns_per_frame"), num(r, "machine_ns_per_frame"), kpps("rate_pps"))
        }
        "generator" if r.get("rate_pps").is_some_and(Value::is_string) => format!("as fast as it can: sent {}", kpps("sent_pps")),
        "generator" => format!("asked {}, sent {} ({:+.2}%), received {}", kpps("rate_pps"), kpps("sent_pps"), num(r, "rate_error") * 100.0, kpps("received_pps")),
        "tcp_throughput" if r.contains_key("dut_ns_per_frame") => format!(
            "{:.2} Gbit/s TCP, {} retransmits; {:.0} ns of the device's CPUs per frame, the busiest of them {:.0}% busy, the lab's busiest CPU {:.0}%",
            num(r, "gbps"),
            num(r, "retransmits"),
            num(r, "dut_ns_per_frame"),
            num(r, "dut_cpu_busy_max") * 100.0,
            num(r, "lab_cpu_busy") * 100.0
        ),
        "tcp_throughput" => format!("{:.2} Gbit/s TCP, {} retransmits", num(r, "gbps"), num(r, "retransmits")),
        "syn_flood" => format!("{} of {} SYNs answered, median {:.1} us", num(r, "answered"), num(r, "sent"), num(r, "median_us")),
        _ => Value::Object(r.clone()).to_string(),
    }
}

/// Builds a result object from (name, value) pairs.
pub fn object<const N: usize>(fields: [(&str, Value); N]) -> Map<String, Value> {
    fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(criterion: Criterion) -> Line {
        Line {
            test: "throughput",
            dut: "kernel".into(),
            frame_size: 64,
            flows: 1024,
            criterion,
            method: "RFC 2544",
            result: object([("rate_pps", json!(123_456.0)), ("offered_pps", json!(123_400.0)), ("received_pps", json!(123_400.0))]),
            generator_limited: false,
        }
    }

    #[test]
    fn json_lines_carry_the_contracts_fields() {
        let v = line(Criterion::Zero).to_json();
        for k in ["test", "dut", "frame_size", "flows", "criterion", "throughput"] {
            assert!(v.get(k).is_some(), "{k} missing from {v}");
        }
        assert_eq!(v["criterion"], json!("zero"));
        assert_eq!(v["throughput"]["rate_pps"], json!(123_456.0));
        assert_eq!(line(Criterion::from_fraction(0.001)).to_json()["criterion"], json!(0.001));
    }

    #[test]
    fn criteria_judge_loss() {
        assert!(Criterion::Zero.allows(0.0) && !Criterion::Zero.allows(1e-9));
        assert!(Criterion::Fraction(0.001).allows(0.0009) && !Criterion::Fraction(0.001).allows(0.0011));
        assert_eq!(Criterion::from_fraction(0.0), Criterion::Zero);
    }

    #[test]
    fn rows_read_as_a_table() {
        let row = line(Criterion::Zero).row();
        assert!(row.starts_with("throughput") && row.contains("123.5 kpps"), "{row}");
        assert!(header().starts_with("test"));
    }

    #[test]
    fn a_tcp_row_says_what_the_device_spent_and_who_set_the_rate() {
        let mut tcp = Line { test: "tcp_throughput", method: "iperf3", result: object([("gbps", json!(3.2)), ("retransmits", json!(4))]), ..line(Criterion::Zero) };
        assert!(tcp.row().ends_with("3.20 Gbit/s TCP, 4 retransmits"), "{}", tcp.row());
        tcp.result.extend(object([("dut_ns_per_frame", json!(1900.4)), ("dut_cpu_busy_max", json!(0.55)), ("lab_cpu_busy", json!(0.998))]));
        tcp.generator_limited = true;
        let row = tcp.row();
        assert!(row.ends_with("1900 ns of the device's CPUs per frame, the busiest of them 55% busy, the lab's busiest CPU 100% (generator limit)"), "{row}");
    }
}
