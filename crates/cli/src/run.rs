//! `natrix run`: the live NAT in the foreground. Prints a line with `ready`
//! on stdout once it forwards; SIGTERM or SIGINT stop it (exit 0), and so
//! does an interface deleted under it (exit 1, `link_watch`); SIGHUP
//! reloads the configuration without losing state, or refuses a bad one and
//! keeps the running one. Its own messages go to stderr through `tracing`:
//! one plain line each, coloured only on a terminal, without the time stamp
//! when stderr is the systemd journal (which stamps lines itself).

use std::io::IsTerminal;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use natrix_control::api::LogCounters;
use natrix_control::cluster::bgp::Announcement;
use natrix_control::cluster::node::{ClusterNode, EventTee, NodeSettings};
use natrix_control::config::cluster::{ClusterConfig, Prefix4};
use natrix_control::{api, Config, IoBackend, LoggingConfig, Offload, PreferBusyPoll, XdpProgramMode};
use natrix_dataplane::{ControlError, Dataplane, DeviceDeferral, IoChoice, LinkSettings, Logged, Offloading, Settings, StartOptions, XdpAttach};
use natrix_io::iface::Interface;
use natrix_io::{InterfaceLock, LOCK_DIR};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{error, info, warn};

use crate::Failure;

mod link_watch;

#[derive(clap::Args)]
pub struct Args {
    /// The TOML configuration file; `[inside]` and `[outside]` name the interfaces.
    #[arg(long)]
    config: PathBuf,
}

const EVENT_BUFFER: usize = 1 << 16;

pub fn run(args: &Args) -> Result<(), Failure> {
    init_tracing();
    // Before the dataplane makes any mapping: the log's start mark comes
    // no later than this run's first record.
    let started_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    // Handlers first, so a signal during start-up is held for the loop below
    // instead of killing the process; then masked while the other threads
    // start, so they inherit the mask and only this thread ever takes them.
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(|e| Failure::Other(format!("installing signal handlers: {e}")))?;
    // Also kept apart from the loop below, which a deleted interface may end
    // before it reads a SIGTERM that came at the same moment.
    let told_to_stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGTERM, SIGINT] {
        signal_hook::flag::register(signal, told_to_stop.clone()).map_err(|e| Failure::Other(format!("installing signal handlers: {e}")))?;
    }
    let masked = SignalMask::block(&[SIGTERM, SIGINT, SIGHUP]);
    let cfg = load(&args.config)?;
    let settings = settings(&cfg, &args.config)?;
    let _locks = lock_interfaces(&settings)?;
    // Found before the dataplane opens them, so that the watch follows the
    // interfaces it opened.
    let served = served_interfaces(&cfg);
    let dp =
        Arc::new(Dataplane::start_with(settings, StartOptions { gateway6: cfg.live.gateway6, ports: None }).map_err(|e| Failure::Other(format!("starting the dataplane: {e}")))?);
    // A start that fails from here on still stops the threads and puts
    // back what the dataplane changed (other threads may hold `dp`).
    let _stop_on_exit = StopOnExit(dp.clone());
    for note in dp.notes() {
        info!("{note}");
    }
    let cluster = match &cfg.cluster {
        Some(c) => Some(ClusterNode::start(node_settings(&cfg, c), dp.clone()).map_err(|e| Failure::Other(format!("cluster: {e}")))?),
        None => None,
    };
    let logger = Logger::start(dp.take_events(), &cfg.logging, cluster.as_ref().map(ClusterNode::tee), started_ns).map_err(Failure::Other)?;
    if let Some(listen) = &cfg.live.management_listen {
        let addr = api::serve(listen, dp.clone(), logger.counters(), cluster.as_ref().map(ClusterNode::status_handle))
            .map_err(|e| Failure::Other(format!("management.listen {listen}: {e}")))?;
        info!("management API and metrics on http://{addr}/");
    }
    // Started while signals are masked, as the other threads are.
    let watch = link_watch::LinkWatch::start(served, signals.handle()).map_err(|e| Failure::Other(format!("starting the link watch: {e}")))?;
    drop(masked);
    println!(
        "natrix: ready: forwarding between {} and {} ({}, {} worker{})",
        cfg.live.inside_interface.as_deref().unwrap_or_default(),
        cfg.live.outside_interface.as_deref().unwrap_or_default(),
        dp.backend(),
        dp.workers(),
        if dp.workers() == 1 { "" } else { "s" }
    );
    let mut running = cfg;
    for signal in signals.forever() {
        match signal {
            SIGHUP => match reload(&args.config, &running, &dp, &logger, cluster.as_ref()) {
                Some(new) => running = new,
                // A refused reload still lets go of a log file rotated away
                // (logrotate's SIGHUP): the JSON log is opened again.
                None => logger.reconfigure(&running.logging),
            },
            SIGTERM | SIGINT => break,
            _ => {}
        }
    }
    // Ended before the stop, which may take links down; a signal's stop
    // exits 0 whatever the links did meanwhile.
    let deleted = watch.end().filter(|_| !told_to_stop.load(Ordering::Relaxed));
    // Withdrawn first: routers move the traffic away before natrix stops forwarding.
    if let Some(c) = cluster {
        c.stop();
    }
    dp.stop();
    logger.stop();
    info!("stopped");
    deleted.map_or(Ok(()), |reason| Err(Failure::Other(reason)))
}

/// The interfaces `natrix run` serves, as they are now.
fn served_interfaces(cfg: &Config) -> Vec<Interface> {
    [&cfg.live.inside_interface, &cfg.live.outside_interface].into_iter().flatten().filter_map(|name| Interface::lookup(name).ok()).collect()
}

/// Stops the dataplane when `run` returns, however it does.
struct StopOnExit(Arc<Dataplane>);

impl Drop for StopOnExit {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// natrix's own messages: one plain line each on stderr. On a terminal,
/// `TIME LEVEL message` in colour (unless NO_COLOR is set); elsewhere the
/// same without colour; and when stderr is the systemd journal (systemd
/// says so in JOURNAL_STREAM), `<PRIORITY>message`, the sd-daemon prefix
/// from which journald takes each line's priority, without the time it
/// stamps itself.
fn init_tracing() {
    let stderr = std::io::stderr();
    let ansi = stderr.is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(tracing::Level::INFO).with_target(false).with_ansi(ansi);
    // A subscriber already set is kept.
    let _ = if stderr_is_journal() { builder.event_format(JournalFormat).try_init() } else { builder.try_init() };
}

/// Whether stderr is the stream systemd connected to the journal: its
/// device and inode are those JOURNAL_STREAM names (`DEV:INODE`).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else { return false };
    stream.to_str().and_then(|s| s.split_once(':')).is_some_and(|(dev, ino)| dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino()))
}

/// `<N>message`: N is the syslog priority (3 error, 4 warning, 6 info, 7 debug).
struct JournalFormat;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JournalFormat
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let priority = match *event.metadata().level() {
            tracing::Level::ERROR => 3,
            tracing::Level::WARN => 4,
            tracing::Level::INFO => 6,
            _ => 7,
        };
        write!(writer, "<{priority}>")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// What the cluster node runs with: the interfaces whose state decides
/// announcements, the routes (the pool via the outside address, a default
/// via the inside address) and where BIRD's files go.
fn node_settings(cfg: &Config, c: &ClusterConfig) -> NodeSettings {
    let run = std::env::var_os("RUNTIME_DIRECTORY").map_or_else(|| PathBuf::from("/run/natrix"), PathBuf::from);
    NodeSettings {
        cluster: c.clone(),
        interfaces: [cfg.live.inside_interface.clone().unwrap_or_default(), cfg.live.outside_interface.clone().unwrap_or_default()],
        routes: node_routes(cfg),
        run_dir: run.join(format!("cluster-{}", c.node)),
    }
}

/// The pool via the outside address and a default via the inside address.
fn node_routes(cfg: &Config) -> Vec<(Prefix4, Ipv4Addr)> {
    let outside = Ipv4Addr::from(cfg.engine.outside_addr.unwrap_or_default());
    let inside = Ipv4Addr::from(cfg.engine.inside_addr);
    Announcement::of_node(&cfg.engine.pool, outside, inside)
}

fn load(path: &Path) -> Result<Config, Failure> {
    let cfg = Config::load(path).map_err(|e| Failure::Config(format!("{}: {e}", path.display())))?;
    for w in &cfg.warnings {
        warn!("{}: {w}", path.display());
    }
    Ok(cfg)
}

/// One natrix per interface: held until natrix exits, however it exits.
fn lock_interfaces(settings: &Settings) -> Result<[InterfaceLock; 2], Failure> {
    let lock = |name: &str| InterfaceLock::acquire(Path::new(LOCK_DIR), name).map_err(|e| Failure::Other(e.to_string()));
    Ok([lock(&settings.inside.interface)?, lock(&settings.outside.interface)?])
}

fn settings(cfg: &Config, path: &Path) -> Result<Settings, Failure> {
    if let Some(missing) = cfg.missing_for_run().into_iter().next() {
        return Err(Failure::Config(format!("{}: {missing}", path.display())));
    }
    let missing = |key: &str| Failure::Config(format!("{}: {key}: missing", path.display()));
    let live = &cfg.live;
    let inside = live.inside_interface.clone().ok_or_else(|| missing("inside.interface"))?;
    let outside = live.outside_interface.clone().ok_or_else(|| missing("outside.interface"))?;
    let outside_addr = cfg.engine.outside_addr.ok_or_else(|| missing("outside.address"))?;
    Ok(Settings {
        engine: engine_to_run(cfg),
        inside: LinkSettings { interface: inside, addr: cfg.engine.inside_addr, prefix_len: cfg.engine.inside_prefix_len },
        outside: LinkSettings { interface: outside, addr: outside_addr, prefix_len: live.outside_prefix_len },
        gateway: live.gateway.map(u32::from),
        workers: live.workers as u16,
        io: match live.io {
            IoBackend::Auto => IoChoice::Auto,
            IoBackend::AfXdp => IoChoice::AfXdp,
            IoBackend::AfPacket => IoChoice::AfPacket,
        },
        busy_poll: live.busy_poll,
        prefer_busy_poll: match live.prefer_busy_poll {
            PreferBusyPoll::Auto => DeviceDeferral::Auto,
            PreferBusyPoll::On => DeviceDeferral::On,
            PreferBusyPoll::Off => DeviceDeferral::Off,
        },
        offload: match live.offload {
            Offload::Auto => Offloading::Auto,
            Offload::On => Offloading::On,
            Offload::Off => Offloading::Off,
        },
        xdp_mode: match live.xdp_mode {
            XdpProgramMode::Auto => XdpAttach::Auto,
            XdpProgramMode::Native => XdpAttach::Native,
            XdpProgramMode::Generic => XdpAttach::Generic,
        },
        event_buffer: EVENT_BUFFER,
    })
}

/// Reads the file again and applies it; on any refusal, says why and keeps
/// the running configuration.
fn reload(path: &Path, running: &Config, dp: &Dataplane, logger: &Logger, cluster: Option<&ClusterNode>) -> Option<Config> {
    let refuse = |why: String| {
        error!("reload refused: {why}; still running the previous configuration");
        None
    };
    let new = match Config::load(path) {
        Ok(c) => c,
        Err(e) => return refuse(format!("{}: {e}", path.display())),
    };
    if let Some(key) = running.restart_key_changed(&new) {
        return refuse(format!("{key} changed: that needs a restart"));
    }
    match dp.reload(&engine_to_run(&new)) {
        Ok(()) => {}
        Err(e @ ControlError::PartlyApplied { .. }) => {
            error!("reload stopped part way: {e}");
            return None;
        }
        Err(e) => return refuse(e.to_string()),
    }
    if let Some(c) = cluster.filter(|_| new.engine.pool != running.engine.pool) {
        c.set_routes(node_routes(&new));
    }
    logger.reconfigure(&new.logging);
    for w in &new.warnings {
        warn!("{}: {w}", path.display());
    }
    info!("configuration reloaded from {}", path.display());
    Some(new)
}

/// The engine's configuration as `natrix run` runs it: session sync streams
/// session events too, whatever the log keeps, at start and after a reload.
fn engine_to_run(cfg: &Config) -> natrix_engine::EngineConfig {
    let mut engine = cfg.engine.clone();
    if cfg.cluster.as_ref().is_some_and(|c| c.sync.is_some()) {
        engine.log_sessions = true;
    }
    engine
}

/// Signals blocked in this thread while it lives, so the threads started
/// meanwhile (dataplane, logger, API) inherit the mask and never take them:
/// their system calls are not interrupted, and the handlers of
/// `signal_hook` run on this thread once the mask is dropped (a signal that
/// came meanwhile is delivered then).
struct SignalMask(libc::sigset_t);

impl SignalMask {
    fn block(signals: &[libc::c_int]) -> SignalMask {
        // SAFETY: sigset manipulation on a local set; pthread_sigmask only
        // changes this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in signals {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            SignalMask(set)
        }
    }
}

impl Drop for SignalMask {
    fn drop(&mut self) {
        // SAFETY: unblocks, in this thread only, the set blocked above.
        unsafe {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.0, std::ptr::null_mut());
        }
    }
}

use natrix_control::ipfix::{Clock, LossCounter};
use natrix_control::sinks::{JsonTarget, LogSinks};

/// How often the logger hands a partly filled IPFIX message and buffered
/// JSON lines over, when events trickle in.
const LOG_FLUSH_EVERY: Duration = Duration::from_millis(200);
/// How long the logger rests after an event woke it, before it takes what
/// came meanwhile. A logger waiting on the channel is woken by each event
/// a worker sends while it waits, and on a CPU it shares with a worker
/// each wake-up preempts the packet path: at 56-112 thousand new
/// connections a second it preempted the worker some 1,300 times a second
/// (docs/BENCHMARKS.md, "The logger's wake-ups"). Resting, it takes what
/// came at most 200 times a second; the channel holds `EVENT_BUFFER`
/// events, 13 million a second for this long.
const LOG_DRAIN_EVERY: Duration = Duration::from_millis(5);

/// Writes NAT events to the configured sinks (JSON lines, IPFIX, syslog)
/// off the packet path. The workers count what does not fit in the channel
/// as lost; the sinks count what they had to drop (collector unreachable,
/// socket buffer full, file write failing) in `lost`, which lives as long
/// as the logger, across reloads.
struct Logger {
    control: mpsc::Sender<LoggerCommand>,
    thread: std::thread::JoinHandle<()>,
    lost: LossCounter,
    recorded: LossCounter,
}

enum LoggerCommand {
    Reconfigure(LoggingConfig),
    Stop,
}

impl Logger {
    /// `tee`: the cluster node, handed every NAT event for session sync.
    /// `started_ns`: when `natrix run` began, marked in the JSON log.
    fn start(events: Option<Receiver<Logged>>, cfg: &LoggingConfig, tee: Option<EventTee>, started_ns: u64) -> Result<Logger, String> {
        let events = events.ok_or("the event stream was already taken")?;
        let lost = LossCounter::default();
        let recorded = LossCounter::default();
        let counted = recorded.clone();
        let lost_by_sinks = lost.clone();
        let (mut sinks, errors) = LogSinks::open(cfg, JsonTarget::Append, Clock::Wall, &lost, None);
        if let Some(e) = errors.into_iter().next() {
            return Err(e);
        }
        sinks.write_start(started_ns);
        let (control, commands) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("natrix-log".into())
            .spawn(move || {
                let mut flushed = Instant::now();
                loop {
                    match events.recv_timeout(LOG_FLUSH_EVERY) {
                        Ok(e) => {
                            record(&mut sinks, tee.as_ref(), &counted, &e);
                            std::thread::sleep(LOG_DRAIN_EVERY);
                            if !drain(&events, &mut sinks, tee.as_ref(), &counted) {
                                break;
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                    if flushed.elapsed() >= LOG_FLUSH_EVERY {
                        sinks.flush();
                        report_json_error(&mut sinks);
                        flushed = Instant::now();
                    }
                    match commands.try_recv() {
                        Ok(LoggerCommand::Reconfigure(cfg)) => {
                            sinks.flush();
                            let (new, errors) = LogSinks::open(&cfg, JsonTarget::Append, Clock::Wall, &lost_by_sinks, Some(sinks));
                            for e in errors {
                                error!("{e}; its records are counted as lost until a reload fixes it (the JSON log is also tried again every 10 s)");
                            }
                            sinks = new;
                        }
                        Ok(LoggerCommand::Stop) => break,
                        Err(_) => {}
                    }
                }
                // What the workers left: the cluster node has stopped by now,
                // so it is not handed these.
                drain(&events, &mut sinks, None, &counted);
                sinks.flush();
            })
            .map_err(|e| format!("starting the logger: {e}"))?;
        Ok(Logger { control, thread, lost, recorded })
    }

    fn reconfigure(&self, cfg: &LoggingConfig) {
        let _ = self.control.send(LoggerCommand::Reconfigure(cfg.clone()));
    }

    /// Records recorded and dropped by the sinks, shared with the metrics
    /// (the workers' `events_lost` adds to the dropped ones).
    fn counters(&self) -> LogCounters {
        LogCounters { recorded: self.recorded.clone(), lost: self.lost.clone() }
    }

    fn stop(self) {
        let _ = self.control.send(LoggerCommand::Stop);
        let _ = self.thread.join();
        let lost = self.lost.load(std::sync::atomic::Ordering::Relaxed);
        if lost > 0 {
            warn!("{lost} log records lost by the exporters (collector or syslog unreachable, or the log file failing)");
        }
    }
}

/// Hands a worker's log item to the cluster node and the sinks.
fn record(sinks: &mut LogSinks, tee: Option<&EventTee>, counted: &LossCounter, item: &Logged) {
    if let (Some(t), Logged::Nat(event)) = (tee, item) {
        t.send(event);
    }
    if write(sinks, item) {
        counted.fetch_add(1, Ordering::Relaxed);
    }
    report_json_error(sinks);
}

/// Records the items waiting in the channel, at most a channel's worth, so
/// that workers keeping it full cannot hold off the logger's flushes and
/// reloads; false once the workers have gone.
fn drain(events: &Receiver<Logged>, sinks: &mut LogSinks, tee: Option<&EventTee>, counted: &LossCounter) -> bool {
    for _ in 0..EVENT_BUFFER {
        match events.try_recv() {
            Ok(e) => record(sinks, tee, counted, &e),
            Err(TryRecvError::Empty) => return true,
            Err(TryRecvError::Disconnected) => return false,
        }
    }
    true
}

/// Hands a worker's log item to the sinks; whether it is a record they keep.
fn write(sinks: &mut LogSinks, item: &Logged) -> bool {
    match item {
        Logged::Nat(e) => sinks.write(e),
        Logged::Function(r) => sinks.write_record(r),
    }
}

/// A JSON log that stopped taking writes, and once it takes them again:
/// each said once; its records meanwhile count as lost.
fn report_json_error(sinks: &mut LogSinks) {
    if let Some(err) = sinks.take_json_error() {
        error!("writing the event log: {err}; its records are counted as lost until it can be written again (tried every 10 s, and at a reload)");
    }
    if sinks.take_json_recovered() {
        info!("the event log is written again");
    }
}

/// An address operators type, for `show` and `clear`.
pub fn parse_subscriber(s: &str) -> Result<Ipv4Addr, Failure> {
    s.parse().map_err(|_| Failure::Other(format!("--subscriber {s}: not an IPv4 address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event of a burst is logged once, an event after a quiet spell
    /// is logged without waiting for more, and one sent just before the
    /// stop is written too.
    #[test]
    fn the_logger_records_bursts_events_after_quiet_spells_and_the_rest_at_its_stop() {
        let dir = std::env::temp_dir().join(format!("natrix-logger-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let path = dir.join("events.jsonl");
        let cfg = LoggingConfig { unit: natrix_control::config::LogUnit::Mapping, json: Some(path.clone()), ipfix: None, syslog: None };
        let (tx, rx) = mpsc::sync_channel(EVENT_BUFFER);
        let logger = Logger::start(Some(rx), &cfg, None, 0).expect("the logger starts");
        let event = |port: u16| {
            let e = natrix_engine::Event {
                kind: natrix_engine::EventKind::MappingCreated,
                time_ns: 1,
                proto: natrix_engine::Proto::Udp,
                int_addr: 0x6440_0001,
                int_port: port,
                ext_addr: 0xcb00_7101,
                ext_port: port,
                ext_port_end: port,
                rem_addr: 0,
                rem_port: 0,
                b4: None,
            };
            Logged::Nat(e)
        };
        for port in 1024..3024 {
            tx.try_send(event(port)).expect("the channel takes the burst");
        }
        let recorded = logger.counters().recorded;
        let logged = |n: u64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while recorded.load(Ordering::Relaxed) < n && Instant::now() < deadline {
                std::thread::sleep(LOG_DRAIN_EVERY);
            }
            recorded.load(Ordering::Relaxed)
        };
        assert_eq!(logged(2000), 2000, "the burst");
        std::thread::sleep(LOG_FLUSH_EVERY + LOG_FLUSH_EVERY / 2);
        tx.try_send(event(5000)).expect("one more after a quiet spell");
        assert_eq!(logged(2001), 2001, "the event after the quiet spell, before the stop");
        tx.try_send(event(6000)).expect("one more before the stop");
        drop(tx);
        logger.stop();
        assert_eq!(recorded.load(Ordering::Relaxed), 2002);
        let lines = std::fs::read_to_string(&path).expect("the JSON log");
        assert_eq!(lines.lines().filter(|l| l.contains("\"mapping_create\"")).count(), 2002, "each event once");
        assert!(lines.contains("\"subscriber_port\":5000,") && lines.contains("\"subscriber_port\":6000,"), "{}", &lines[lines.len().saturating_sub(400)..]);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The engine a reload hands the workers is built as the one at start:
    /// a node that syncs sessions keeps making their events whatever unit
    /// the log keeps.
    #[test]
    fn session_sync_keeps_session_events_on_whatever_the_log_keeps() {
        let node = "[nat]\npool = [\"203.0.113.0/29\"]\n[logging]\nunit = \"mapping\"\n[cluster]\nnode = \"a\"\nrole = \"active\"\nsubscribers = [\"100.64.0.0/23\"]\nsubscriber_space = [\"100.64.0.0/22\"]\npool_space = [\"203.0.113.0/28\"]\n";
        let syncing = format!("{node}sync_listen = \"192.0.2.1:7400\"\nsync_peer = \"192.0.2.2:7400\"\n");
        assert!(engine_to_run(&Config::parse(&syncing).expect("a syncing node")).log_sessions);
        assert!(!engine_to_run(&Config::parse(node).expect("a node without sync")).log_sessions);
    }
}
