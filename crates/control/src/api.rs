//! The management endpoint: Prometheus metrics at `/metrics` and a JSON API
//! under `/api/` that `natrix show` and `natrix clear` use. A small HTTP/1.1
//! server on its own threads; it reaches the dataplane only through the
//! dataplane's command channels.
//!
//! - `GET /metrics`
//! - `GET /api/stats`
//! - `GET /api/sessions[?subscriber=ADDR]`, `GET /api/mappings[?subscriber=ADDR]`
//! - `POST /api/clear?subscriber=ADDR`

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use natrix_dataplane::Dataplane;
use natrix_engine::admin::{MappingView, SessionView};
use natrix_engine::DropReason;
use serde_json::{json, Value};

use crate::ipfix::LossCounter;
use crate::metrics;

const MAX_REQUEST_BYTES: u64 = 16 * 1024;

/// Starts serving on `listen`; the listener thread lives as long as the process.
/// The logger's counters, shared with the API.
#[derive(Clone, Default)]
pub struct LogCounters {
    /// NAT event records the logger handed to the configured sinks.
    pub recorded: LossCounter,
    /// Records the sinks (IPFIX, syslog, the JSON file) had to drop; the
    /// workers count those the logger never got.
    pub lost: LossCounter,
}

pub fn serve(listen: &str, dataplane: Arc<Dataplane>, log: LogCounters) -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(listen)?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new().name("natrix-api".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let (dp, log) = (dataplane.clone(), log.clone());
            let _ = std::thread::Builder::new().name("natrix-api-conn".into()).spawn(move || handle(stream, &dp, &log));
        }
    })?;
    Ok(addr)
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn json(v: Value) -> Response {
        Response { status: 200, content_type: "application/json", body: format!("{v}\n") }
    }

    fn error(status: u16, message: &str) -> Response {
        Response { status, content_type: "application/json", body: format!("{}\n", json!({ "error": message })) }
    }
}

fn handle(stream: TcpStream, dp: &Dataplane, log: &LogCounters) {
    let log = (log.recorded.load(Ordering::Relaxed), log.lost.load(Ordering::Relaxed));
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    // A request is a line and a few headers: cap what one client may send.
    let mut reader = BufReader::new((&stream).take(MAX_REQUEST_BYTES));
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut header = String::new();
    while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
        header.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let resp = route(method, target, dp, log);
    let reason = match resp.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let mut w = &stream;
    let _ = write!(w, "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", resp.status, resp.content_type, resp.body.len(), resp.body);
}

/// `log`: records the logger recorded and its sinks lost.
fn route(method: &str, target: &str, dp: &Dataplane, log: (u64, u64)) -> Response {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let subscriber = match subscriber_param(query) {
        Ok(s) => s,
        Err(e) => return Response::error(400, &e),
    };
    let result = match (method, path) {
        ("GET", "/metrics") => return metrics_response(dp, log),
        ("GET", "/api/stats") => stats(dp, log),
        ("GET", "/api/sessions") => dp.sessions(subscriber).map(|v| json!(v.iter().map(session_json).collect::<Vec<_>>())),
        ("GET", "/api/mappings") => dp.mappings(subscriber).map(|v| json!(v.iter().map(mapping_json).collect::<Vec<_>>())),
        ("POST", "/api/clear") => match subscriber {
            Some(a) => dp.clear_subscriber(a).map(|c| json!({ "subscriber": Ipv4Addr::from(a).to_string(), "sessions": c.sessions, "mappings": c.mappings })),
            None => return Response::error(400, "clear needs ?subscriber=ADDRESS"),
        },
        (_, "/metrics" | "/api/stats" | "/api/sessions" | "/api/mappings" | "/api/clear") => return Response::error(405, "method not allowed"),
        _ => return Response::error(404, "no such endpoint; see /api/stats, /api/sessions, /api/mappings, /api/clear, /metrics"),
    };
    match result {
        Ok(v) => Response::json(v),
        Err(e) => Response::error(503, &e),
    }
}

fn subscriber_param(query: &str) -> Result<Option<u32>, String> {
    let mut subscriber = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("subscriber", v)) => subscriber = Some(v.parse::<Ipv4Addr>().map(u32::from).map_err(|_| format!("subscriber \"{v}\" is not an IPv4 address"))?),
            _ => return Err(format!("unknown parameter \"{pair}\"")),
        }
    }
    Ok(subscriber)
}

fn metrics_response(dp: &Dataplane, log: (u64, u64)) -> Response {
    match dp.worker_snapshots().and_then(|w| dp.io_snapshot().map(|io| (w, io))) {
        Ok((w, io)) => Response { status: 200, content_type: "text/plain; version=0.0.4", body: metrics::render(&w, &io, log) },
        Err(e) => Response::error(503, &e),
    }
}

fn stats(dp: &Dataplane, (log_recorded, log_lost): (u64, u64)) -> Result<Value, String> {
    let workers = dp.worker_snapshots()?;
    let io = dp.io_snapshot()?;
    let total = |f: &dyn Fn(&natrix_dataplane::WorkerSnapshot) -> u64| -> u64 { workers.iter().map(f).sum() };
    let drops: serde_json::Map<String, Value> =
        DropReason::ALL.iter().map(|&r| (r.name().to_owned(), json!(total(&|w| w.stats.drops.get(r))))).filter(|(_, v)| v.as_u64() != Some(0)).collect();
    Ok(json!({
        "backend": dp.backend(),
        "workers": workers.len(),
        "interfaces": {
            "inside": { "rx_packets": io.rx_frames[0], "rx_bytes": io.rx_bytes[0], "tx_packets": io.tx_frames[0], "tx_bytes": io.tx_bytes[0], "tx_dropped": io.tx_dropped[0], "rx_refused": io.rx_refused[0], "rx_kernel_dropped": io.rx_kernel_dropped[0] },
            "outside": { "rx_packets": io.rx_frames[1], "rx_bytes": io.rx_bytes[1], "tx_packets": io.tx_frames[1], "tx_bytes": io.tx_bytes[1], "tx_dropped": io.tx_dropped[1], "rx_refused": io.rx_refused[1], "rx_kernel_dropped": io.rx_kernel_dropped[1] },
        },
        "sessions": { "tcp": total(&|w| u64::from(w.sessions_by_proto[0])), "udp": total(&|w| u64::from(w.sessions_by_proto[1])), "icmp": total(&|w| u64::from(w.sessions_by_proto[2])) },
        "mappings": { "tcp": total(&|w| u64::from(w.mappings_by_proto[0])), "udp": total(&|w| u64::from(w.mappings_by_proto[1])), "icmp": total(&|w| u64::from(w.mappings_by_proto[2])) },
        "subscribers": total(&|w| w.subscribers),
        "pool": { "ports_in_use": total(&|w| w.ports_in_use), "ports_total": total(&|w| w.total_ports) },
        "translated": { "to_inside": total(&|w| w.stats.forwarded[0]), "to_outside": total(&|w| w.stats.forwarded[1]) },
        "generated": { "to_inside": total(&|w| w.stats.generated[0]), "to_outside": total(&|w| w.stats.generated[1]) },
        "drops": drops,
        "log_records": log_recorded,
        "log_records_lost": total(&|w| w.events_lost) + log_lost,
        "arp": { "replies_sent": io.gateway.arp_replies_sent, "requests_sent": io.gateway.arp_requests_sent, "unresolved": io.gateway.unresolved },
        "per_worker": workers.iter().enumerate().map(|(i, w)| json!({ "worker": i, "packets": w.stats.received.iter().sum::<u64>(), "busy_ns": w.busy_ns, "sessions": w.sessions_by_proto.iter().sum::<u32>() })).collect::<Vec<_>>(),
    }))
}

fn session_json(s: &SessionView) -> Value {
    json!({
        "protocol": s.proto.name(),
        "subscriber": Ipv4Addr::from(s.int_addr).to_string(),
        "inside": format!("{}:{}", Ipv4Addr::from(s.int_addr), s.int_port),
        "outside": format!("{}:{}", Ipv4Addr::from(s.ext_addr), s.ext_port),
        "remote": format!("{}:{}", Ipv4Addr::from(s.rem_addr), s.rem_port),
        "established": s.established,
        "idle_s": s.idle_s,
        "timeout_s": s.timeout_s,
    })
}

fn mapping_json(m: &MappingView) -> Value {
    json!({
        "protocol": m.proto.name(),
        "subscriber": Ipv4Addr::from(m.int_addr).to_string(),
        "inside": format!("{}:{}", Ipv4Addr::from(m.int_addr), m.int_port),
        "outside": format!("{}:{}", Ipv4Addr::from(m.ext_addr), m.ext_port),
        "sessions": m.sessions,
        "static": m.is_static,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriber_parameter_is_parsed_or_refused_by_name() {
        assert_eq!(subscriber_param(""), Ok(None));
        assert_eq!(subscriber_param("subscriber=100.64.0.2"), Ok(Some(0x6440_0002)));
        assert!(subscriber_param("subscriber=banana").unwrap_err().contains("banana"));
        assert!(subscriber_param("colour=red").unwrap_err().contains("colour"));
    }
}
