//! `[syn_accel]`: the SYN accelerator of seed 003, with the keys, defaults
//! and deadline rule of CONTRACTS.md ("SYN accelerator"). It works in every
//! `[nat] mode`, "off" included; an empty `destinations` turns it off.

use natrix_engine::syn_accel::{Deadline, Interval, SynAccelConfig};

use super::{err, parse_destination, ConfigError, Section};
use crate::duration;

const MS: u64 = 1_000_000;

pub(super) fn parse(root: &mut Section, warnings: &mut Vec<String>) -> Result<Option<SynAccelConfig>, ConfigError> {
    let Some(mut s) = root.section("syn_accel")? else { return Ok(None) };
    let destinations = parse_destinations(&mut s)?;
    let interval = s.parsed("interval", parse_interval)?.unwrap_or(Interval::Fixed { ns: SynAccelConfig::DEFAULT_INTERVAL_NS });
    let attempts = s.integer("attempts", 1, u32::from(u8::MAX))?.map_or(SynAccelConfig::DEFAULT_ATTEMPTS, |n| n as u8);
    let deadline = match s.parsed("deadline", positive_ns)? {
        Some(ns) => Deadline::Fixed { ns },
        None if interval == Interval::Learned => Deadline::AttemptsTimesInterval,
        None => Deadline::Fixed { ns: SynAccelConfig::DEFAULT_DEADLINE_NS },
    };
    s.finish()?;
    if let (Interval::Fixed { ns: every }, Deadline::Fixed { ns: by }) = (interval, deadline) {
        let schedule = u64::from(attempts) * every;
        if attempts > 1 && every >= by {
            warnings.push(format!("syn_accel.deadline: {} ms is not after the first interval ({} ms): no SYN will be retransmitted", by / MS, every / MS));
        } else if by > schedule {
            warnings.push(format!(
                "syn_accel.deadline: {} ms is past the schedule's {} SYNs ({} ms): the caller's own retransmissions in between are absorbed, so the server gets no SYN after natrix's last",
                by / MS,
                attempts,
                schedule / MS
            ));
        }
    }
    Ok((!destinations.is_empty()).then_some(SynAccelConfig { destinations, interval, attempts, deadline }))
}

fn parse_destinations(s: &mut Section) -> Result<Vec<natrix_engine::syn_accel::Destination>, ConfigError> {
    let mut out = Vec::new();
    for (i, v) in s.array("destinations")?.into_iter().flatten().enumerate() {
        let key = format!("syn_accel.destinations[{i}]");
        let Some(t) = v.as_str() else { return err(key, "expected a string like \"198.51.100.0/24\", \"198.51.100.7/32:5060\" or \"203.0.113.0/28:8000-8080\"") };
        out.push(parse_destination(t).or_else(|m| err(&key, m))?);
    }
    Ok(out)
}

/// "500ms" (10 ms or more), or "rtt": 1.5 x the handshake time learned
/// per destination.
fn parse_interval(t: &str) -> Result<Interval, String> {
    const FLOOR_MS: u64 = SynAccelConfig::MIN_INTERVAL_NS / MS;
    if t == "rtt" {
        return Ok(Interval::Learned);
    }
    match positive_ns(t) {
        Ok(ns) if ns < SynAccelConfig::MIN_INTERVAL_NS => Err(format!("\"{t}\": at least {FLOOR_MS}ms (more frequent SYNs would flood the destination with copies), or \"rtt\"")),
        Ok(ns) => Ok(Interval::Fixed { ns }),
        Err(e) => Err(format!("{e}, or \"rtt\"")),
    }
}

/// A duration above zero and at most `SynAccelConfig::MAX_DEADLINE_NS` (a minute).
fn positive_ns(t: &str) -> Result<u64, String> {
    let max_ms = SynAccelConfig::MAX_DEADLINE_NS / MS;
    match duration::parse_ms(t)? {
        0 => Err(format!("\"{t}\": must be above zero")),
        ms if ms > max_ms => Err(format!("\"{t}\": at most {}s (the accelerator answers in seconds what a caller's stack takes minutes to)", max_ms / 1000)),
        ms => Ok(ms * MS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use natrix_engine::config::Exemption;

    const BASE: &str = "[nat]\npool = [\"203.0.113.0/28\"]\n";

    fn accel(extra: &str) -> Option<SynAccelConfig> {
        Config::parse(&format!("{BASE}[syn_accel]\n{extra}")).unwrap().engine.syn_accel
    }

    fn problem(extra: &str) -> String {
        Config::parse(&format!("{BASE}[syn_accel]\n{extra}")).unwrap_err().to_string()
    }

    #[test]
    fn the_contract_defaults() {
        let a = accel("destinations = [\"198.51.100.0/24\"]\n").unwrap();
        assert_eq!(a.interval, Interval::Fixed { ns: 500 * MS });
        assert_eq!(a.attempts, 4);
        assert_eq!(a.deadline, Deadline::Fixed { ns: 2_000 * MS });
        let rtt = accel("destinations = [\"198.51.100.0/24\"]\ninterval = \"rtt\"\n").unwrap();
        assert_eq!((rtt.interval, rtt.deadline), (Interval::Learned, Deadline::AttemptsTimesInterval), "with rtt: attempts x interval");
        let set = accel("destinations = [\"198.51.100.0/24\"]\ninterval = \"rtt\"\ndeadline = \"3s\"\n").unwrap();
        assert_eq!(set.deadline, Deadline::Fixed { ns: 3_000 * MS });
    }

    #[test]
    fn destinations_take_prefixes_ports_and_ranges_and_empty_is_off() {
        let a = accel("destinations = [\"198.51.100.0/24\", \"198.51.100.7/32:5060\", \"203.0.113.0/28:8000-8080\"]\n").unwrap();
        assert_eq!(
            a.destinations,
            [
                Exemption { network: 0xc633_6400, prefix_len: 24, ports: (0, u16::MAX) },
                Exemption { network: 0xc633_6407, prefix_len: 32, ports: (5060, 5060) },
                Exemption { network: 0xcb00_7100, prefix_len: 28, ports: (8000, 8080) },
            ]
        );
        assert_eq!(accel("destinations = []\n"), None);
        assert_eq!(accel(""), None);
    }

    #[test]
    fn bad_values_name_the_key() {
        assert!(problem("destinations = [\"198.51.100.1/24\"]\n").starts_with("syn_accel.destinations[0]: \"198.51.100.1/24\" has host bits set"));
        assert!(problem("destinations = [\"198.51.100.0/24:99999\"]\n").starts_with("syn_accel.destinations[0]:"));
        assert!(problem("destinations = [7]\n").starts_with("syn_accel.destinations[0]: expected a string"));
        assert!(problem("interval = \"fast\"\n").starts_with("syn_accel.interval:"));
        assert!(problem("interval = \"0ms\"\n").starts_with("syn_accel.interval: \"0ms\": must be above zero"));
        assert!(problem("interval = \"9ms\"\n").starts_with("syn_accel.interval: \"9ms\": at least 10ms"));
        assert_eq!(accel("destinations = [\"198.51.100.0/24\"]\ninterval = \"10ms\"\n").unwrap().interval, Interval::Fixed { ns: 10 * MS });
        assert!(problem("attempts = 0\n").starts_with("syn_accel.attempts: 0 is out of range 1-255"));
        assert!(problem("deadline = \"0s\"\n").starts_with("syn_accel.deadline:"));
        assert!(problem("deadline = \"61s\"\n").starts_with("syn_accel.deadline: \"61s\": at most 60s"));
        assert!(problem("attempt = 3\n").starts_with("syn_accel.attempt: unknown key; did you mean `attempts`?"));
    }

    #[test]
    fn router_mode_takes_it_too() {
        let c = Config::parse("[nat]\nmode = \"off\"\n[syn_accel]\ndestinations = [\"198.51.100.0/24:5060\"]\n").unwrap();
        assert!(c.engine.syn_accel.is_some() && !c.engine.translate);
    }

    #[test]
    fn a_deadline_past_the_schedule_is_accepted_with_a_warning() {
        let warned = |extra: &str| Config::parse(&format!("{BASE}[syn_accel]\ndestinations = [\"198.51.100.0/24\"]\n{extra}")).unwrap().warnings;
        assert!(warned("attempts = 2\ndeadline = \"30s\"\n").iter().any(|w| w.contains("past the schedule's 2 SYNs (1000 ms)")));
        assert!(warned("").is_empty(), "the defaults end their schedule at the deadline");
    }

    #[test]
    fn a_deadline_before_the_first_copy_is_accepted_with_a_warning() {
        let c = Config::parse(&format!("{BASE}[syn_accel]\ndestinations = [\"198.51.100.0/24\"]\ninterval = \"2s\"\ndeadline = \"1s\"\n")).unwrap();
        assert!(c.warnings.iter().any(|w| w.starts_with("syn_accel.deadline:")), "{:?}", c.warnings);
    }
}
