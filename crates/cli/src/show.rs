//! `natrix show` and `natrix clear`: read or change a running natrix
//! through its management API (`[management] listen`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use clap::ValueEnum;
use serde_json::Value;

use crate::run::parse_subscriber;
use crate::Failure;

const DEFAULT_API: &str = "127.0.0.1:9300";

#[derive(Clone, Copy, ValueEnum)]
pub enum What {
    Sessions,
    Mappings,
    Stats,
    /// A cluster node's role, partner and session sync.
    Cluster,
}

#[derive(clap::Args)]
pub struct ShowArgs {
    what: What,
    /// Only this subscriber's (inside address) sessions or mappings.
    #[arg(long)]
    subscriber: Option<String>,
    /// Only the sessions or mappings of the DS-Lite hosts behind this B4.
    #[arg(long, conflicts_with = "subscriber")]
    b4: Option<std::net::Ipv6Addr>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// At most this many sessions or mappings.
    #[arg(long, default_value_t = DEFAULT_LIMIT)]
    limit: usize,
    /// The management API of the running natrix.
    #[arg(long, default_value = DEFAULT_API)]
    api: String,
}

use natrix_control::api::DEFAULT_LIMIT;

#[derive(Clone, Copy, ValueEnum)]
pub enum Clearable {
    Sessions,
}

#[derive(clap::Args)]
pub struct ClearArgs {
    what: Clearable,
    /// The subscriber (inside address) whose sessions and mappings go.
    #[arg(long)]
    subscriber: String,
    #[arg(long, default_value = DEFAULT_API)]
    api: String,
}

pub fn show(args: &ShowArgs) -> Result<(), Failure> {
    let (path, listing) = match args.what {
        What::Sessions => ("/api/sessions", true),
        What::Mappings => ("/api/mappings", true),
        What::Stats => ("/api/stats", false),
        What::Cluster => ("/api/cluster", false),
    };
    let mut params = Vec::new();
    if let Some(s) = &args.subscriber {
        params.push(format!("subscriber={}", parse_subscriber(s)?));
    }
    if let Some(b4) = args.b4 {
        params.push(format!("b4={b4}"));
    }
    if listing && args.limit != DEFAULT_LIMIT {
        params.push(format!("limit={}", args.limit));
    }
    let query = if params.is_empty() { String::new() } else { format!("?{}", params.join("&")) };
    let v = request(&args.api, "GET", &format!("{path}{query}"))?;
    if let (true, Value::Array(rows)) = (listing, &v) {
        if rows.len() >= args.limit {
            eprintln!("natrix: the first {} shown, there may be more: --limit N for more, --subscriber or --b4 for fewer", rows.len());
        }
    }
    if args.json {
        println!("{v}");
        return Ok(());
    }
    if let Some(b4) = args.b4 {
        println!("{}", softwire_line(b4, &v));
    }
    match args.what {
        What::Sessions => print_table(&v, &["protocol", "b4", "inside", "outside", "remote", "idle_s", "timeout_s"]),
        What::Mappings => print_table(&v, &["protocol", "b4", "inside", "outside", "sessions", "static"]),
        What::Stats => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
        What::Cluster => print_cluster(&v),
    }
    Ok(())
}

/// The B4's own counters, which every row of its hosts carries.
fn softwire_line(b4: std::net::Ipv6Addr, rows: &Value) -> String {
    let Some(w) = rows.as_array().and_then(|r| r.iter().find_map(|r| r["softwire"].as_object())) else {
        return format!("B4 {b4}: no hosts with sessions or mappings");
    };
    let n = |k: &str| w.get(k).and_then(Value::as_u64).unwrap_or(0);
    format!("B4 {b4}: {} sessions; {} packets decapsulated, {} encapsulated; MTU lowered {} times", n("sessions"), n("decapsulated"), n("encapsulated"), n("mtu_lowered"))
}

/// `natrix show cluster`: one line per fact an operator asks first.
fn print_cluster(v: &Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let s = |k: &str| v[k].as_str().unwrap_or("-").to_owned();
    println!(
        "node {} (partition {}): {} for {:.0} s (configured {}; {} role changes)",
        s("node"),
        s("partition"),
        s("role"),
        v["role_seconds"].as_f64().unwrap_or(0.0),
        s("configured_role"),
        n("role_changes")
    );
    let heard = v["peer_heard_ms_ago"].as_u64().map_or_else(|| "never heard".to_owned(), |ms| format!("heard {ms} ms ago"));
    println!("peer {}: {heard}", s("peer"));
    println!("sync lag: {} records not yet acknowledged", n("lag_records"));
    println!("records: sent {}, acknowledged {}, given up {}, retransmitted messages {}", n("records_sent"), n("records_acked"), n("records_given_up"), n("retransmits"));
    println!(
        "received {}, lost {}, installed {}, refused {}, datagrams refused {}",
        n("records_received"),
        n("records_lost"),
        n("records_installed"),
        n("records_refused"),
        n("datagrams_refused")
    );
    let bgp = v["bgp_error"].as_str().map_or(String::new(), |e| format!(" (BGP: {e})"));
    println!(
        "announcing: {}; interfaces {}{bgp}",
        if v["announcing"].as_bool() == Some(true) { "yes" } else { "no" },
        if v["interfaces_up"].as_bool() == Some(true) { "up" } else { "down" }
    );
}

pub fn clear(args: &ClearArgs) -> Result<(), Failure> {
    let Clearable::Sessions = args.what;
    let sub = parse_subscriber(&args.subscriber)?;
    let v = request(&args.api, "POST", &format!("/api/clear?subscriber={sub}"))?;
    println!("cleared {} sessions and {} mappings of {sub}", v["sessions"], v["mappings"]);
    Ok(())
}

/// Prints `rows` under `columns`; the `b4` column only when a row has a B4.
fn print_table(rows: &Value, columns: &[&str]) {
    let rows = rows.as_array().map(Vec::as_slice).unwrap_or_default();
    let any_b4 = rows.iter().any(|r| r["b4"].is_string());
    let columns: Vec<&str> = columns.iter().copied().filter(|&c| c != "b4" || any_b4).collect();
    let columns = &columns[..];
    let cell = |r: &Value, c: &str| match &r[c] {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let widths: Vec<usize> = columns.iter().map(|c| rows.iter().map(|r| cell(r, c).len()).chain([c.len()]).max().unwrap_or(0)).collect();
    let line = |cells: Vec<String>| cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ");
    println!("{}", line(columns.iter().map(|c| c.to_string()).collect()));
    for r in rows {
        println!("{}", line(columns.iter().map(|c| cell(r, c)).collect()));
    }
    println!("({} total)", rows.len());
}

/// One HTTP/1.1 request; the body of a 200 answer as JSON, else the
/// server's error message.
fn request(api: &str, method: &str, path: &str) -> Result<Value, Failure> {
    let unreachable = |e: std::io::Error| Failure::Other(format!("cannot reach natrix's management API at {api}: {e} (is natrix running with [management] listen = \"{api}\"?)"));
    let mut s = TcpStream::connect(api).map_err(unreachable)?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(unreachable)?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {api}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").map_err(unreachable)?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(unreachable)?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(|| Failure::Other(format!("{api}: not an HTTP answer")))?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    let json: Value = serde_json::from_str(body).map_err(|e| Failure::Other(format!("{api}: answer is not JSON: {e}")))?;
    if status != "200" {
        return Err(Failure::Other(format!("{api}: {}", json["error"].as_str().unwrap_or(status))));
    }
    Ok(json)
}
