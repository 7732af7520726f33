//! The management endpoint: Prometheus metrics at `/metrics` and a JSON API
//! under `/api/` that `natrix show` and `natrix clear` use. HTTP/1.1 by
//! hyper on a single-threaded tokio runtime on its own thread; requests are
//! answered by a small fixed pool of handler threads, which reach the
//! dataplane only through its command channels.
//!
//! - `GET /metrics`
//! - `GET /api/stats`
//! - `GET /api/sessions`, `GET /api/mappings`, with `?subscriber=ADDR` or
//!   `?b4=IPV6` (the DS-Lite hosts behind it) and `&limit=N` (at most N
//!   rows, [`DEFAULT_LIMIT`] unless asked); rows of DS-Lite hosts carry
//!   their B4 and its counters
//! - `POST /api/clear?subscriber=ADDR`
//! - `GET /api/cluster` (a cluster node: its role, partner and session sync)
//!
//! Limits, so that no client (idle, slow or hostile) keeps the others from
//! being answered: at most [`MAX_CONNECTIONS`] connections are open; when a
//! new one arrives at the limit, the oldest connection whose request is not
//! being answered is closed to make room (a client that connected and sent
//! nothing yet, or is slow to send or read), and only if every connection
//! is being answered is the newcomer closed. A request head (request line
//! and headers) must arrive within [`HEADER_TIMEOUT`] and fit in
//! [`MAX_HEADER_BYTES`] (else 431); a connection lives at most
//! [`CONNECTION_TIMEOUT`]; one request per connection; request bodies are
//! never read.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use natrix_dataplane::{ControlError, Dataplane, Only};
use natrix_engine::admin::{MappingView, SessionView, SoftwireView};
use natrix_engine::DropReason;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::AbortHandle;

use crate::cluster::node::ClusterStatus;
use crate::ipfix::LossCounter;
use crate::metrics::{self, Format};

/// Connections open at once; past it the oldest idle one is closed.
pub const MAX_CONNECTIONS: usize = 256;
/// Request line and headers together; a larger head is answered 431.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Time for a client to send its request head, counted from its connection.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection lives, answer included.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// Threads that run handlers (dataplane queries), so a slow query never
/// holds up accepting or reading other requests.
const HANDLER_THREADS: usize = 4;
/// Connections the kernel queues before natrix accepts them.
const BACKLOG: u32 = 1024;
/// hyper's read buffer, which must hold a request head.
const READ_BUFFER: usize = 64 * 1024;

/// The logger's counters, shared with the API.
#[derive(Clone, Default)]
pub struct LogCounters {
    /// NAT event records the logger handed to the configured sinks.
    pub recorded: LossCounter,
    /// Records the sinks (IPFIX, syslog, the JSON file) had to drop; the
    /// workers count those the logger never got.
    pub lost: LossCounter,
}

struct Context {
    dp: Arc<Dataplane>,
    log: LogCounters,
    cluster: Option<Arc<Mutex<ClusterStatus>>>,
}

/// Starts serving on `listen` (`ADDRESS:PORT`); the server thread lives as
/// long as the process. Returns the address bound.
pub fn serve(listen: &str, dataplane: Arc<Dataplane>, log: LogCounters, cluster: Option<Arc<Mutex<ClusterStatus>>>) -> std::io::Result<SocketAddr> {
    let addr = listen.to_socket_addrs()?.next().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "resolves to no address"))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().max_blocking_threads(HANDLER_THREADS).thread_name("natrix-api-handler").build()?;
    let listener = runtime.block_on(async {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(BACKLOG)
    })?;
    let bound = listener.local_addr()?;
    let ctx = Arc::new(Context { dp: dataplane, log, cluster });
    std::thread::Builder::new().name("natrix-api".into()).spawn(move || runtime.block_on(accept_loop(listener, ctx)))?;
    Ok(bound)
}

/// The open connections, oldest first.
#[derive(Default)]
struct Connections {
    next_id: u64,
    open: BTreeMap<u64, Connection>,
}

struct Connection {
    /// A handler is answering its request.
    busy: Arc<AtomicBool>,
    task: AbortHandle,
}

impl Connections {
    /// Closes the oldest connection whose request is not being answered;
    /// false if there is none.
    fn close_oldest_idle(&mut self) -> bool {
        let Some(id) = self.open.iter().find(|(_, c)| !c.busy.load(Ordering::Relaxed)).map(|(&id, _)| id) else {
            return false;
        };
        if let Some(c) = self.open.remove(&id) {
            c.task.abort();
        }
        true
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Context>) {
    let connections = Arc::new(Mutex::new(Connections::default()));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_header_size(MAX_HEADER_BYTES).max_buf_size(READ_BUFFER).keep_alive(false);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of file descriptors or memory (or a connection reset
                // before it was accepted): make room, and pause rather than
                // spin on an error that repeats.
                connections.lock().expect("connections lock").close_oldest_idle();
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let busy = Arc::new(AtomicBool::new(false));
        let id = {
            let mut c = connections.lock().expect("connections lock");
            if c.open.len() >= MAX_CONNECTIONS && !c.close_oldest_idle() {
                // Every connection is being answered: this one waits its turn
                // by reconnecting.
                continue;
            }
            c.next_id += 1;
            c.next_id
        };
        let task = tokio::spawn(connection(http.clone(), stream, ctx.clone(), busy.clone(), id, connections.clone()));
        // The task cannot have run yet: this thread is the runtime's only one
        // and has not yielded since spawning it.
        connections.lock().expect("connections lock").open.insert(id, Connection { busy, task: task.abort_handle() });
    }
}

async fn connection(http: http1::Builder, stream: TcpStream, ctx: Arc<Context>, busy: Arc<AtomicBool>, id: u64, connections: Arc<Mutex<Connections>>) {
    let service = service_fn(move |req| handle(req, ctx.clone(), busy.clone()));
    let _ = tokio::time::timeout(CONNECTION_TIMEOUT, http.serve_connection(TokioIo::new(stream), service)).await;
    connections.lock().expect("connections lock").open.remove(&id);
}

async fn handle(req: Request<Incoming>, ctx: Arc<Context>, busy: Arc<AtomicBool>) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let format = Format::from_accept(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
    busy.store(true, Ordering::Relaxed);
    let answer = tokio::task::spawn_blocking(move || {
        let log = (ctx.log.recorded.load(Ordering::Relaxed), ctx.log.lost.load(Ordering::Relaxed));
        let cluster = ctx.cluster.as_ref().and_then(|c| c.lock().ok().map(|s| s.clone()));
        route(&method, &path, &query, &ctx.dp, log, cluster.as_ref(), format)
    })
    .await
    .unwrap_or_else(|_| Response::error(500, "internal error"));
    busy.store(false, Ordering::Relaxed);
    let mut resp = hyper::Response::new(Full::new(Bytes::from(answer.body)));
    *resp.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(answer.content_type));
    Ok(resp)
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

/// `log`: records the logger recorded and its sinks lost.
fn route(method: &str, path: &str, query: &str, dp: &Dataplane, log: (u64, u64), cluster: Option<&ClusterStatus>, format: Format) -> Response {
    let listing = matches!(path, "/api/sessions" | "/api/mappings");
    let Query { only, limit } = match query_params(query, listing) {
        Ok(q) => q,
        Err(e) => return Response::error(400, &e),
    };
    let result = match (method, path) {
        ("GET", "/metrics") => return metrics_response(dp, log, cluster, format),
        ("GET", "/api/cluster") => match cluster {
            Some(c) => Ok(json!(c)),
            None => return Response::error(404, "not a cluster node: the configuration has no [cluster] section"),
        },
        ("GET", "/api/stats") => stats(dp, log),
        ("GET", "/api/sessions") => dp.sessions(only, limit).map(|v| json!(v.iter().map(session_json).collect::<Vec<_>>())),
        ("GET", "/api/mappings") => dp.mappings(only, limit).map(|v| json!(v.iter().map(mapping_json).collect::<Vec<_>>())),
        ("POST", "/api/clear") => match only.subscriber {
            Some(a) => dp.clear_subscriber(a).map(|c| json!({ "subscriber": Ipv4Addr::from(a).to_string(), "sessions": c.sessions, "mappings": c.mappings })),
            None => return Response::error(400, "clear needs ?subscriber=ADDRESS"),
        },
        (_, "/metrics" | "/api/stats" | "/api/sessions" | "/api/mappings" | "/api/clear" | "/api/cluster") => return Response::error(405, "method not allowed"),
        _ => return Response::error(404, "no such endpoint; see /api/stats, /api/sessions, /api/mappings, /api/clear, /api/cluster, /metrics"),
    };
    match result {
        Ok(v) => Response::json(v),
        Err(e) => Response::error(503, &e.to_string()),
    }
}

/// Rows a listing (`/api/sessions`, `/api/mappings`) returns unless the
/// request asks for another number: enough for any one subscriber, and a
/// bounded answer (tens of megabytes of JSON) for a whole table of millions.
pub const DEFAULT_LIMIT: usize = 100_000;

/// What a request's query string asks for.
#[derive(Debug, PartialEq, Eq)]
struct Query {
    only: Only,
    limit: usize,
}

/// The query's parameters; `b4` and `limit` only for a `listing`
/// (elsewhere they would be ignored, and a clear that ignored `b4` would
/// clear more than asked).
fn query_params(query: &str, listing: bool) -> Result<Query, String> {
    let mut q = Query { only: Only::default(), limit: DEFAULT_LIMIT };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("b4" | "limit", _)) if !listing => return Err(format!("\"{pair}\": only /api/sessions and /api/mappings take it")),
            Some(("b4", v)) => q.only.b4 = Some(v.parse::<std::net::Ipv6Addr>().map_err(|_| format!("b4 \"{v}\" is not an IPv6 address"))?),
            Some(("subscriber", v)) => q.only.subscriber = Some(v.parse::<Ipv4Addr>().map(u32::from).map_err(|_| format!("subscriber \"{v}\" is not an IPv4 address"))?),
            Some(("limit", v)) => q.limit = v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| format!("limit \"{v}\" is not a number of rows above 0"))?,
            _ => return Err(format!("unknown parameter \"{pair}\"")),
        }
    }
    Ok(q)
}

fn metrics_response(dp: &Dataplane, log: (u64, u64), cluster: Option<&ClusterStatus>, format: Format) -> Response {
    match dp.worker_snapshots().and_then(|w| dp.io_snapshot().map(|io| (w, io))) {
        Ok((w, io)) => Response { status: 200, content_type: format.content_type(), body: metrics::render(&w, &io, log, cluster, format) },
        Err(e) => Response::error(503, &e.to_string()),
    }
}

fn stats(dp: &Dataplane, (log_recorded, log_lost): (u64, u64)) -> Result<Value, ControlError> {
    let workers = dp.worker_snapshots()?;
    let io = dp.io_snapshot()?;
    let total = |f: &dyn Fn(&natrix_dataplane::WorkerSnapshot) -> u64| -> u64 { workers.iter().map(f).sum() };
    let completed = io.checksums_completed(&workers);
    let drops: serde_json::Map<String, Value> =
        DropReason::ALL.iter().map(|&r| (r.name().to_owned(), json!(total(&|w| w.stats.drops.get(r))))).filter(|(_, v)| v.as_u64() != Some(0)).collect();
    Ok(json!({
        "backend": dp.backend(),
        "workers": workers.len(),
        "interfaces": {
            "inside": { "rx_packets": io.rx_frames[0], "rx_bytes": io.rx_bytes[0], "tx_packets": io.tx_frames[0], "tx_bytes": io.tx_bytes[0], "tx_dropped": io.tx_dropped[0], "rx_refused": io.rx_refused[0], "rx_checksums_completed": completed[0], "rx_kernel_dropped": io.rx_kernel_dropped[0] },
            "outside": { "rx_packets": io.rx_frames[1], "rx_bytes": io.rx_bytes[1], "tx_packets": io.tx_frames[1], "tx_bytes": io.tx_bytes[1], "tx_dropped": io.tx_dropped[1], "rx_refused": io.rx_refused[1], "rx_checksums_completed": completed[1], "rx_kernel_dropped": io.rx_kernel_dropped[1] },
        },
        "system_calls": { "transmit": io.transmit_calls, "receive": io.receive_calls, "wait": io.wait_calls },
        "sessions": { "tcp": total(&|w| u64::from(w.sessions_by_proto[0])), "udp": total(&|w| u64::from(w.sessions_by_proto[1])), "icmp": total(&|w| u64::from(w.sessions_by_proto[2])), "sctp": total(&|w| u64::from(w.sessions_by_proto[3])) },
        "mappings": { "tcp": total(&|w| u64::from(w.mappings_by_proto[0])), "udp": total(&|w| u64::from(w.mappings_by_proto[1])), "icmp": total(&|w| u64::from(w.mappings_by_proto[2])), "sctp": total(&|w| u64::from(w.mappings_by_proto[3])) },
        "subscribers": total(&|w| w.subscribers),
        "pool": { "ports_in_use": total(&|w| w.ports_in_use), "ports_total": total(&|w| w.total_ports) },
        "translated": { "to_inside": total(&|w| w.stats.forwarded[0]) + io.offloaded_frames[0], "to_outside": total(&|w| w.stats.forwarded[1]) + io.offloaded_frames[1] },
        "offloaded": { "to_inside": io.offloaded_frames[0], "to_outside": io.offloaded_frames[1], "flows": total(&|w| w.offloaded_flows), "table_full": total(&|w| w.offload_table_full), "returned": offload_returned(&workers), "egress": { "inside": io.offload_egress[0], "outside": io.offload_egress[1] } },
        "generated": { "to_inside": total(&|w| w.stats.generated[0]), "to_outside": total(&|w| w.stats.generated[1]) },
        "drops": drops,
        "log_records": log_recorded,
        "log_records_lost": total(&|w| w.events_lost) + log_lost,
        "arp": { "replies_sent": io.gateway.arp_replies_sent, "requests_sent": io.gateway.arp_requests_sent, "unresolved": io.gateway.unresolved },
        "nd": { "adverts_sent": io.gateway.nd_adverts_sent, "solicits_sent": io.gateway.nd_solicits_sent },
        "per_worker": workers.iter().enumerate().map(|(i, w)| json!({ "worker": i, "packets": w.stats.received.iter().sum::<u64>(), "busy_ns": w.busy_ns, "received_frames": w.received, "sessions": w.sessions_by_proto.iter().sum::<u32>() })).collect::<Vec<_>>(),
    }))
}

/// Flow directions the XDP offload handed back to the workers, by why.
fn offload_returned(workers: &[natrix_dataplane::WorkerSnapshot]) -> Value {
    let by_reason =
        natrix_dataplane::OffloadReturned::ALL.iter().enumerate().map(|(i, r)| (r.name().to_owned(), workers.iter().map(|w| w.offload_returned[i]).sum::<u64>().into()));
    Value::Object(by_reason.collect())
}

fn session_json(s: &SessionView) -> Value {
    json!({
        "protocol": s.proto.name(),
        "subscriber": Ipv4Addr::from(s.int_addr).to_string(),
        "b4": s.b4.map(|b| b.to_string()),
        "softwire": s.softwire.as_ref().map(softwire_json),
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
        "b4": m.b4.map(|b| b.to_string()),
        "softwire": m.softwire.as_ref().map(softwire_json),
        "inside": format!("{}:{}", Ipv4Addr::from(m.int_addr), m.int_port),
        "outside": format!("{}:{}", Ipv4Addr::from(m.ext_addr), m.ext_port),
        "sessions": m.sessions,
        "static": m.is_static,
    })
}

/// A B4's own counters, on each row of its hosts: per-B4 Prometheus
/// labels would make one series per B4 (README "DS-Lite").
fn softwire_json(w: &SoftwireView) -> Value {
    json!({
        "decapsulated": w.counters.decapsulated,
        "encapsulated": w.counters.encapsulated,
        "mtu_lowered": w.counters.mtu_lowered,
        "sessions": w.sessions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_parsed_or_refused_by_name() {
        let only = |subscriber, b4| Only { subscriber, b4 };
        assert_eq!(query_params("", true), Ok(Query { only: only(None, None), limit: DEFAULT_LIMIT }));
        assert_eq!(query_params("subscriber=100.64.0.2", true), Ok(Query { only: only(Some(0x6440_0002), None), limit: DEFAULT_LIMIT }));
        assert_eq!(query_params("subscriber=100.64.0.2&limit=5", true), Ok(Query { only: only(Some(0x6440_0002), None), limit: 5 }));
        assert_eq!(query_params("b4=2001:db8::7", true), Ok(Query { only: only(None, "2001:db8::7".parse().ok()), limit: DEFAULT_LIMIT }));
        assert!(query_params("b4=192.0.2.1", true).unwrap_err().contains("192.0.2.1"));
        assert!(query_params("subscriber=banana", true).unwrap_err().contains("banana"));
        assert!(query_params("limit=0", true).unwrap_err().contains("limit"));
        assert!(query_params("limit=many", true).unwrap_err().contains("many"));
        assert!(query_params("colour=red", true).unwrap_err().contains("colour"));
        assert_eq!(query_params("subscriber=100.64.0.2", false).map(|q| q.only.subscriber), Ok(Some(0x6440_0002)), "a clear's subscriber");
        assert!(query_params("subscriber=100.64.0.2&b4=2001:db8::7", false).unwrap_err().contains("b4"), "a clear of one B4's hosts would clear the whole subscriber");
        assert!(query_params("limit=5", false).unwrap_err().contains("limit"));
    }

    #[test]
    fn the_oldest_idle_connection_makes_room_and_busy_ones_are_kept() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let mut c = Connections::default();
            let mut tasks = Vec::new();
            for id in 1..=3 {
                let task = tokio::spawn(std::future::pending::<()>());
                c.open.insert(id, Connection { busy: Arc::new(AtomicBool::new(id == 1)), task: task.abort_handle() });
                tasks.push(task);
            }
            // 1 is being answered: 2 is the oldest idle one.
            assert!(c.close_oldest_idle());
            assert_eq!(c.open.keys().copied().collect::<Vec<_>>(), [1, 3]);
            assert!(tasks.remove(1).await.unwrap_err().is_cancelled());
            assert!(c.close_oldest_idle());
            assert_eq!(c.open.keys().copied().collect::<Vec<_>>(), [1]);
            // Only a busy one left: nothing is closed.
            assert!(!c.close_oldest_idle());
            assert_eq!(c.open.len(), 1);
        });
    }
}
