//! `natrix whois ADDRESS:PORT`: which subscriber held an external address
//! and port at a given time (RFC 6888 section 4's abuse-response question).
//! From natrix's JSON-lines event log (`--log`): the mapping or port block
//! records that cover the port, from their create record to their delete
//! record. From a configuration (`--config`): deterministic mode's formula
//! (RFC 7422) and static mappings, which hold for as long as the
//! configuration is in force.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use natrix_control::config::parse_endpoint;
use natrix_control::eventlog::rfc3339;
use natrix_engine::deterministic::Member;
use natrix_engine::Proto;
use serde::Serialize;
use serde_json::Value;

use crate::Failure;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["log", "config"])))]
pub struct Args {
    /// External address and port (for ICMP, the query identifier), e.g. 203.0.113.1:40000.
    endpoint: String,
    /// Only this protocol (default: every protocol).
    #[arg(long, value_parser = ["tcp", "udp", "icmp", "sctp"])]
    proto: Option<String>,
    /// When: RFC 3339 (2026-05-01T12:00:00Z) or Unix seconds (default: now).
    #[arg(long)]
    at: Option<String>,
    /// natrix's JSON-lines event log ([logging] json).
    #[arg(long)]
    log: Option<PathBuf>,
    /// A configuration: answers from deterministic mode's formula and static
    /// mappings. Given again for each of a cluster's nodes (`--config
    /// a.toml --config b.toml`): the one whose pool holds the address answers.
    #[arg(long)]
    config: Vec<PathBuf>,
    /// Print a JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
struct Answer {
    proto: &'static str,
    /// None for a B4 of deterministic mode, whose range every host behind it shares.
    #[serde(skip_serializing_if = "Option::is_none")]
    subscriber: Option<Ipv4Addr>,
    /// A DS-Lite host's B4 (RFC 6333); `subscriber` is then its address in the softwire.
    #[serde(skip_serializing_if = "Option::is_none")]
    b4: Option<Ipv6Addr>,
    /// The subscriber's own port (mapping records and static mappings).
    #[serde(skip_serializing_if = "Option::is_none")]
    subscriber_port: Option<u16>,
    external: Ipv4Addr,
    external_port: u16,
    /// The external port range the subscriber held (port blocks, deterministic mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    port_range: Option<[u16; 2]>,
    /// Start of the interval; None when it began before the log does, or always.
    from: Option<String>,
    /// End of the interval; None while still held, or always.
    until: Option<String>,
    still_held: bool,
    /// Held for as long as the configuration is in force.
    always: bool,
    /// What the answer comes from: "mapping", "block", "static" or "deterministic".
    source: &'static str,
}

#[derive(Serialize)]
struct Query {
    external: Ipv4Addr,
    port: u16,
    proto: Option<&'static str>,
    at: String,
}

#[derive(Serialize)]
struct Output<'a> {
    query: Query,
    held: bool,
    answers: &'a [Answer],
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let (addr, port) = parse_endpoint(&args.endpoint).map_err(Failure::Usage)?;
    let proto = args.proto.as_deref().map(|p| Proto::ALL.into_iter().find(|x| x.name() == p).expect("clap checked"));
    let at_ns = match &args.at {
        Some(t) => parse_time(t).map_err(|e| Failure::Usage(format!("--at: {e}")))?,
        None => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64),
    };
    let answers = if let Some(path) = &args.log {
        from_log(path, addr, port, proto, at_ns)?
    } else if !args.config.is_empty() {
        let configs = load_configs(&args.config)?;
        let (path, cfg) = configs.iter().find(|(_, c)| c.engine.pool.binary_search(&addr).is_ok()).unwrap_or(&configs[0]);
        from_config(path, cfg, addr, port, proto)
    } else {
        unreachable!("clap requires --log or --config")
    };
    let query = Query { external: Ipv4Addr::from(addr), port, proto: proto.map(Proto::name), at: fmt_time(at_ns) };
    if args.json {
        let out = Output { held: !answers.is_empty(), answers: &answers, query };
        println!("{}", serde_json::to_string_pretty(&out).expect("serializes"));
    } else if answers.is_empty() {
        let what = proto.map_or(String::new(), |p| format!(" ({})", p.name()));
        println!("nobody held {}:{port}{what} at {}", query.external, query.at);
    } else {
        for a in &answers {
            println!("{}", describe(a, &query.at));
        }
    }
    if answers.is_empty() {
        // Nobody held it: say so (done above) and exit 1.
        std::process::exit(1);
    }
    Ok(())
}

fn describe(a: &Answer, at: &str) -> String {
    let named = match (a.subscriber, a.b4) {
        (Some(s), _) => format!("subscriber {s}"),
        (None, Some(b4)) => format!("B4 {b4}"),
        (None, None) => "subscriber ?".to_owned(),
    };
    let mut who = match (a.subscriber_port, a.port_range) {
        (Some(p), _) => format!("{named}:{p}"),
        (None, Some([f, l])) => format!("{named} (port range {f}-{l})"),
        (None, None) => named,
    };
    match (a.subscriber, a.b4) {
        (Some(_), Some(b4)) => who = format!("{who} behind B4 {b4}"),
        (None, Some(_)) => who = format!("{who}, shared by every host behind it"),
        _ => {}
    }
    let when = if a.always {
        "always, while this config is in force".to_owned()
    } else {
        let from = a.from.as_deref().map_or("before the log begins".to_owned(), |f| format!("from {f}"));
        let until = a.until.as_deref().map_or("still held".to_owned(), |u| format!("until {u}"));
        format!("{from} {until}")
    };
    let source = match a.source {
        "mapping" => "mapping in the log",
        "block" => "port block in the log",
        "static" => "static mapping in the config",
        _ => "deterministic mode, RFC 7422",
    };
    let at = if a.always { String::new() } else { format!(" at {at}") };
    format!("{}:{} {}{at}: {who}, {when} ({source})", a.external, a.external_port, a.proto)
}

fn fmt_time(ns: i64) -> String {
    rfc3339(ns.max(0) as u64)
}

/// RFC 3339 (`2026-05-01T12:00:00Z`, `2026-05-01T14:00:00.5+02:00`) or Unix
/// seconds (`1777636800`, `1777636800.25`), as nanoseconds since the epoch.
pub fn parse_time(t: &str) -> Result<i64, String> {
    let t = t.trim();
    if let Some(ns) = parse_unix(t) {
        return Ok(ns);
    }
    parse_rfc3339(t).ok_or_else(|| format!("\"{t}\" is neither RFC 3339 (2026-05-01T12:00:00Z) nor Unix seconds"))
}

fn parse_unix(t: &str) -> Option<i64> {
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = int.parse().ok()?;
    Some(secs.checked_mul(1_000_000_000)? + frac_ns(frac))
}

/// Nanoseconds of a decimal fraction's digits ("25" -> 250 ms).
fn frac_ns(digits: &str) -> i64 {
    digits.bytes().take(9).enumerate().map(|(i, b)| i64::from(b - b'0') * 10i64.pow(8 - i as u32)).sum()
}

fn parse_rfc3339(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    let num = |r: std::ops::Range<usize>| digits(t.get(r)?);
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d, h, mi, s) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut rest = &t[19..];
    let mut frac = 0;
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        frac = frac_ns(&r[..n]);
        rest = &r[n..];
    }
    let offset_s = match rest {
        "Z" | "z" => 0,
        _ => {
            let rb = rest.as_bytes();
            if rb.len() != 6 || !matches!(rb[0], b'+' | b'-') || rb[3] != b':' {
                return None;
            }
            let (oh, om) = (digits(rest.get(1..3)?)?, digits(rest.get(4..6)?)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if rb[0] == b'-' {
                -o
            } else {
                o
            }
        }
    };
    let secs = days_from_civil(y, mo as u32, d as u32) * 86_400 + h * 3600 + mi * 60 + s - offset_s;
    Some(secs * 1_000_000_000 + frac)
}

fn digits(s: &str) -> Option<i64> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Howard Hinnant's civil-to-days algorithm (proleptic Gregorian calendar).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// One holding of an external port (or block) read from the log.
#[derive(Debug, Clone)]
struct Held {
    proto: Proto,
    subscriber: Ipv4Addr,
    b4: Option<Ipv6Addr>,
    subscriber_port: Option<u16>,
    first: u16,
    last: u16,
    from_ns: Option<i64>,
    until_ns: Option<i64>,
    block: bool,
}

impl Held {
    fn covers(&self, at: i64) -> bool {
        self.from_ns.is_none_or(|f| f <= at) && self.until_ns.is_none_or(|u| at < u)
    }
}

/// What a log line says about the queried address, if anything.
struct Record {
    proto: Proto,
    create: bool,
    block: bool,
    subscriber: Ipv4Addr,
    b4: Option<Ipv6Addr>,
    subscriber_port: Option<u16>,
    first: u16,
    last: u16,
    time_ns: i64,
}

/// The time of a line `natrix run` wrote as it started.
fn restart_of(v: &Value) -> Option<i64> {
    if v.get("event")?.as_str()? != natrix_control::eventlog::START_EVENT {
        return None;
    }
    parse_time(v.get("time")?.as_str()?).ok()
}

fn record_of(v: &Value, addr: Ipv4Addr, port: u16) -> Option<Record> {
    let (create, block) = match v.get("event")?.as_str()? {
        "mapping_create" => (true, false),
        "mapping_delete" => (false, false),
        "block_allocate" => (true, true),
        "block_release" => (false, true),
        _ => return None,
    };
    if v.get("external")?.as_str()?.parse::<Ipv4Addr>().ok()? != addr {
        return None;
    }
    let first = u16::try_from(v.get("external_port")?.as_u64()?).ok()?;
    let last = if block { u16::try_from(v.get("port_range_end")?.as_u64()?).ok()? } else { first };
    if !(first..=last).contains(&port) {
        return None;
    }
    let proto_name = v.get("proto")?.as_str()?;
    Some(Record {
        proto: Proto::ALL.into_iter().find(|p| p.name() == proto_name)?,
        create,
        block,
        subscriber: v.get("subscriber")?.as_str()?.parse().ok()?,
        b4: v.get("b4").and_then(Value::as_str).and_then(|b| b.parse().ok()),
        subscriber_port: v.get("subscriber_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()),
        first,
        last,
        time_ns: parse_time(v.get("time")?.as_str()?).ok()?,
    })
}

/// Every holding of `addr:port` in the log, in log order: a create opens
/// one, the matching delete (same protocol, ports and subscriber) closes it.
/// Lines that are not JSON events (a torn last line after a crash or a full
/// disk) are skipped and counted in a warning.
fn holdings(path: &std::path::Path, addr: Ipv4Addr, port: u16) -> Result<Vec<Held>, Failure> {
    let unreadable = |e: std::io::Error| Failure::Usage(format!("{}: {e}", path.display()));
    let mut reader = BufReader::new(File::open(path).map_err(unreadable)?);
    let mut done: Vec<Held> = Vec::new();
    let mut open: Vec<Held> = Vec::new();
    let mut skipped = Skipped::default();
    let mut line = Vec::new();
    for n in 1.. {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(unreadable)? == 0 {
            break;
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(&line) else {
            skipped.note(n);
            continue;
        };
        if let Some(at) = restart_of(&v) {
            // natrix holds nothing as it starts: what stayed open ended by then.
            for mut h in open.drain(..) {
                h.until_ns = Some(at);
                done.push(h);
            }
        } else if let Some(r) = record_of(&v, addr, port) {
            follow(&mut open, &mut done, r);
        }
    }
    skipped.warn(path);
    done.extend(open);
    Ok(done)
}

/// Lines of the log that could not be read.
#[derive(Default)]
struct Skipped {
    count: u64,
    first: u64,
}

impl Skipped {
    fn note(&mut self, line: u64) {
        if self.count == 0 {
            self.first = line;
        }
        self.count += 1;
    }

    fn warn(&self, path: &std::path::Path) {
        match self.count {
            0 => {}
            1 => eprintln!("natrix: warning: {}: skipped 1 unreadable line (line {}); answering from the rest", path.display(), self.first),
            n => eprintln!("natrix: warning: {}: skipped {n} unreadable lines (the first is line {}); answering from the rest", path.display(), self.first),
        }
    }
}

/// Applies one create or delete record to the open and finished holdings.
fn follow(open: &mut Vec<Held>, done: &mut Vec<Held>, r: Record) {
    let same = |h: &Held| h.proto == r.proto && h.block == r.block && (h.first, h.last) == (r.first, r.last);
    let held = |from_ns, until_ns| Held {
        proto: r.proto,
        subscriber: r.subscriber,
        b4: r.b4,
        subscriber_port: r.subscriber_port,
        first: r.first,
        last: r.last,
        from_ns,
        until_ns,
        block: r.block,
    };
    if r.create && r.proto == Proto::Sctp {
        // SCTP translates no port: many associations (of one subscriber or
        // several) hold an external address and port at once, each from its
        // create to its own delete, which the delete branch pairs oldest first.
        open.push(held(Some(r.time_ns), None));
    } else if r.create {
        // A create over an open holding (a restart lost the delete) ends it.
        if let Some(i) = open.iter().position(same) {
            let mut h = open.swap_remove(i);
            h.until_ns = Some(r.time_ns);
            done.push(h);
        }
        open.push(held(Some(r.time_ns), None));
    } else if let Some(i) = open.iter().position(|h| same(h) && (h.subscriber, h.b4) == (r.subscriber, r.b4)) {
        let mut h = open.remove(i);
        h.until_ns = Some(r.time_ns);
        done.push(h);
    } else {
        // Created before the log begins.
        done.push(held(None, Some(r.time_ns)));
    }
}

fn from_log(path: &std::path::Path, addr: u32, port: u16, proto: Option<Proto>, at: i64) -> Result<Vec<Answer>, Failure> {
    let external = Ipv4Addr::from(addr);
    let mut answers: Vec<Answer> = holdings(path, external, port)?
        .into_iter()
        .filter(|h| proto.is_none_or(|p| p == h.proto) && h.covers(at))
        .map(|h| Answer {
            proto: h.proto.name(),
            subscriber: Some(h.subscriber),
            b4: h.b4,
            subscriber_port: if h.block { None } else { h.subscriber_port },
            external,
            external_port: port,
            port_range: h.block.then_some([h.first, h.last]),
            from: h.from_ns.map(fmt_time),
            until: h.until_ns.map(fmt_time),
            still_held: h.until_ns.is_none(),
            always: false,
            source: if h.block { "block" } else { "mapping" },
        })
        .collect();
    // A subscriber with several SCTP associations on the port is named once.
    let mut named = std::collections::HashSet::new();
    answers.retain(|a| a.proto != Proto::Sctp.name() || named.insert(a.subscriber));
    answers.sort_by_key(|a| Proto::ALL.iter().position(|p| p.name() == a.proto));
    Ok(answers)
}

fn load_configs(paths: &[PathBuf]) -> Result<Vec<(&std::path::Path, natrix_control::Config)>, Failure> {
    paths.iter().map(|p| natrix_control::Config::load(p).map(|c| (p.as_path(), c)).map_err(|e| Failure::Config(format!("{}: {e}", p.display())))).collect()
}

fn from_config(path: &std::path::Path, cfg: &natrix_control::Config, addr: u32, port: u16, proto: Option<Proto>) -> Vec<Answer> {
    let e = &cfg.engine;
    let det = e.deterministic.as_ref();
    let external = Ipv4Addr::from(addr);
    let mut answers = Vec::new();
    for p in Proto::ALL.into_iter().filter(|p| proto.is_none_or(|q| q == *p)) {
        let base = Answer {
            proto: p.name(),
            subscriber: None,
            b4: None,
            subscriber_port: None,
            external,
            external_port: port,
            port_range: None,
            from: None,
            until: None,
            still_held: true,
            always: true,
            source: "static",
        };
        if p == Proto::Sctp {
            // The formula names every subscriber of the address for SCTP:
            // said only when asked for (`--proto sctp`), not for every port query.
            let asked = proto == Some(Proto::Sctp);
            let formula = det.filter(|_| asked).map(|d| sctp_from_formula(d, addr, e.ports)).unwrap_or_default();
            answers.extend(formula.into_iter().map(|m| Answer { subscriber_port: Some(port), source: "deterministic", ..member_answer(m, &base) }));
        } else if let Some(st) = e.statics.iter().find(|st| st.proto == p && st.ext_addr == addr && st.ext_port == port) {
            answers.push(Answer { subscriber: Some(Ipv4Addr::from(st.int_addr)), subscriber_port: Some(st.int_port), ..base });
        } else if let Some(a) = det.as_ref().and_then(|d| d.owner(addr, port)) {
            answers.push(Answer { port_range: Some([a.first, a.last]), source: "deterministic", ..member_answer(a.subscriber, &base) });
        }
    }
    if answers.is_empty() && det.is_none() {
        eprintln!("natrix: {}: dynamic mode: only static mappings are in the config; dynamic mappings are in the event log (--log)", path.display());
    }
    answers
}

/// Deterministic mode and SCTP: an association leaves from its subscriber's
/// formula address with its own port, untranslated (seed 001), so every
/// subscriber of `addr` may have held any port there: the formula narrows it
/// no further. One port of each range in `ports` finds that range's subscriber.
fn sctp_from_formula(det: &natrix_engine::deterministic::Deterministic, addr: u32, ports: (u16, u16)) -> Vec<Member> {
    let step = usize::from(det.ports_per_subscriber().max(1));
    (u32::from(ports.0)..=u32::from(ports.1)).step_by(step).filter_map(|p| det.owner(addr, p as u16)).map(|a| a.subscriber).collect()
}

/// `base` answered for a subscriber of the formula: an IPv4 address, or a
/// B4 (DS-Lite) with no inner address, since its hosts share its range.
fn member_answer(m: Member, base: &Answer) -> Answer {
    match m {
        Member::Ipv4(a) => Answer { subscriber: Some(Ipv4Addr::from(a)), ..base.clone() },
        Member::B4(b4) => Answer { b4: Some(b4), ..base.clone() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_both_ways_and_agree() {
        let unix = parse_time("1795435200").unwrap();
        assert_eq!(fmt_time(unix), "2026-11-23T12:00:00.000Z");
        assert_eq!(parse_time("2026-11-23T12:00:00Z").unwrap(), unix);
        assert_eq!(parse_time("2026-11-23T13:30:00+01:30").unwrap(), unix);
        assert_eq!(parse_time("2026-11-23T12:00:00.123Z").unwrap(), unix + 123_000_000);
        assert_eq!(parse_time("2026-11-23T07:00:00.5-05:00").unwrap(), unix + 500_000_000);
        assert_eq!(parse_time("1795435200.25").unwrap(), unix + 250_000_000);
        assert_eq!(parse_time("2000-02-29T00:00:00Z").unwrap(), 951_782_400_000_000_000);
        for bad in ["yesterday", "2026-13-01T00:00:00Z", "2026-11-23T12:00:00", "2026-11-23T12:00:00+0100", "-5", "1.2.3"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoints_need_an_address_and_a_port() {
        assert_eq!(parse_endpoint("203.0.113.1:40000"), Ok((0xcb00_7101, 40000)));
        assert!(parse_endpoint("203.0.113.1").is_err());
        assert!(parse_endpoint("203.0.113.1:70000").is_err());
        assert!(parse_endpoint("host:80").is_err());
    }

    #[test]
    fn log_intervals_pair_creates_with_deletes() {
        let dir = std::env::temp_dir().join(format!("natrix-whois-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("events.jsonl");
        let line = |t: &str, ev: &str, sub: &str, sp: u16| {
            format!(r#"{{"time":"{t}","event":"{ev}","nat_event":8,"proto":"udp","subscriber":"{sub}","subscriber_port":{sp},"external":"203.0.113.1","external_port":40000}}"#)
        };
        let text = [
            line("2026-01-01T00:00:00.000Z", "mapping_create", "100.64.0.10", 5000),
            line("2026-01-01T00:05:00.000Z", "mapping_delete", "100.64.0.10", 5000),
            line("2026-01-01T01:00:00.000Z", "mapping_create", "100.64.0.11", 6000),
            r#"{"time":"2026-01-01T02:00:00.000Z","event":"block_allocate","nat_event":16,"proto":"tcp","subscriber":"100.64.0.12","external":"203.0.113.1","external_port":39936,"port_range_end":39999}"#.to_owned(),
        ]
        .join("\n");
        std::fs::write(&log, text).unwrap();
        let at = |t: &str| parse_time(t).unwrap();
        let a = from_log(&log, 0xcb00_7101, 40000, None, at("2026-01-01T00:01:00Z")).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].subscriber, a[0].subscriber_port, a[0].still_held), (Some(Ipv4Addr::new(100, 64, 0, 10)), Some(5000), false));
        assert_eq!(a[0].until.as_deref(), Some("2026-01-01T00:05:00.000Z"));
        assert!(from_log(&log, 0xcb00_7101, 40000, None, at("2026-01-01T00:05:00Z")).unwrap().is_empty());
        let a = from_log(&log, 0xcb00_7101, 40000, Some(Proto::Udp), at("2026-01-01T03:00:00Z")).unwrap();
        assert_eq!((a[0].subscriber, a[0].still_held), (Some(Ipv4Addr::new(100, 64, 0, 11)), true));
        assert!(from_log(&log, 0xcb00_7101, 40000, Some(Proto::Tcp), at("2026-01-01T03:00:00Z")).unwrap().is_empty());
        let a = from_log(&log, 0xcb00_7101, 39990, Some(Proto::Tcp), at("2026-01-01T03:00:00Z")).unwrap();
        assert_eq!((a[0].subscriber, a[0].port_range, a[0].source), (Some(Ipv4Addr::new(100, 64, 0, 12)), Some([39936, 39999]), "block"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A natrix that stopped uncleanly logged no deletion; its next start
    /// ends what stayed open: after it, nobody held the port.
    #[test]
    fn a_restart_ends_the_holdings_a_crash_left_open() {
        let dir = std::env::temp_dir().join(format!("natrix-whois-restart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("events.jsonl");
        let text = [
            r#"{"time":"2026-01-01T00:00:00.000Z","event":"natrix_start"}"#,
            r#"{"time":"2026-01-01T00:01:00.000Z","event":"mapping_create","nat_event":8,"proto":"udp","subscriber":"100.64.0.10","subscriber_port":5000,"external":"203.0.113.1","external_port":40000}"#,
            r#"{"time":"2026-01-01T03:00:00.000Z","event":"natrix_start"}"#,
        ]
        .join("\n");
        std::fs::write(&log, text).unwrap();
        let at = |t: &str| parse_time(t).unwrap();
        let a = from_log(&log, 0xcb00_7101, 40000, None, at("2026-01-01T02:00:00Z")).unwrap();
        assert_eq!((a.len(), a[0].subscriber, a[0].still_held), (1, Some(Ipv4Addr::new(100, 64, 0, 10)), false));
        assert_eq!(a[0].until.as_deref(), Some("2026-01-01T03:00:00.000Z"), "held until the restart at the latest");
        assert!(from_log(&log, 0xcb00_7101, 40000, None, at("2026-01-01T04:00:00Z")).unwrap().is_empty(), "nobody after the restart");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sctp_associations_hold_a_port_together_each_until_its_own_delete() {
        let dir = std::env::temp_dir().join(format!("natrix-whois-sctp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("events.jsonl");
        let line = |t: &str, ev: &str, sub: &str| {
            format!(
                r#"{{"time":"2026-01-01T00:{t}.000Z","event":"{ev}","nat_event":8,"proto":"sctp","subscriber":"{sub}","subscriber_port":5000,"external":"203.0.113.1","external_port":5000}}"#
            )
        };
        let text = [
            line("00:00", "mapping_create", "100.64.0.10"),
            line("01:00", "mapping_create", "100.64.0.11"),
            line("02:00", "mapping_create", "100.64.0.10"),
            line("03:00", "mapping_delete", "100.64.0.10"),
            line("04:00", "mapping_delete", "100.64.0.11"),
        ]
        .join("\n");
        std::fs::write(&log, text).unwrap();
        let who = |t: &str| {
            let at = parse_time(&format!("2026-01-01T00:{t}Z")).unwrap();
            let mut who: Vec<String> = from_log(&log, 0xcb00_7101, 5000, Some(Proto::Sctp), at).unwrap().into_iter().filter_map(|a| a.subscriber.map(|s| s.to_string())).collect();
            who.sort();
            who
        };
        assert_eq!(who("01:30"), ["100.64.0.10", "100.64.0.11"], "a second subscriber does not end the first's holding");
        assert_eq!(who("03:30"), ["100.64.0.10", "100.64.0.11"], "100.64.0.10's second association still holds it");
        assert_eq!(who("04:30"), ["100.64.0.10"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
