//! The threads of a running natrix and the handle that controls them.
//!
//! With one worker, one thread does everything for a frame: receive, ARP,
//! translate, next hop, transmit. With N workers, an I/O thread owns both
//! interfaces and the ARP state, steers each IPv4 frame to the worker that
//! owns its state over a lock-free ring, and transmits what the workers hand
//! back; each worker owns one engine and never takes a lock per packet.
//! Operators reach the threads through command channels that are checked
//! between batches, so the packet path has no shared state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use natrix_engine::admin::{Cleared, MappingView, SessionView};
use natrix_engine::config::prefix_contains;
use natrix_engine::shard::{Owners, Shard};
use natrix_engine::{Engine, EngineConfig, Event, Side, Stats, Verdict};
use natrix_io::af_packet::AfPacketPort;
use natrix_io::af_xdp::AfXdpPort;
use natrix_io::iface::Interface;
use natrix_io::{IoError, PacketPort};

use crate::gateway::{Gateway, GatewayCounters, Ingress, Link};
use crate::ring::{self, wait_readable, Consumer, Doorbell, Producer, MAX_POP};
use crate::steer::Steering;

const BATCH: usize = 64;
const RING_FRAMES: usize = 4096;
/// Empty polls before a thread sleeps (unless busy polling).
const SPINS_BEFORE_SLEEP: u32 = 200;
/// A sleeping thread still wakes this often to run the engine's timers.
const SLEEP_MS: i32 = 100;
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoChoice {
    Auto,
    AfXdp,
    AfPacket,
}

#[derive(Debug, Clone)]
pub struct LinkSettings {
    pub interface: String,
    pub addr: u32,
    pub prefix_len: u8,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub engine: EngineConfig,
    pub inside: LinkSettings,
    pub outside: LinkSettings,
    pub gateway: Option<u32>,
    pub workers: u16,
    pub io: IoChoice,
    pub busy_poll: bool,
    /// Events waiting for the logger; past this they are counted as lost.
    pub event_buffer: usize,
}

#[derive(Debug)]
pub enum DataplaneError {
    Io(IoError),
    Engine(natrix_engine::EngineError),
    Thread(std::io::Error),
    /// A thread panicked while holding the thread list.
    Poisoned,
}

impl std::fmt::Display for DataplaneError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataplaneError::Io(e) => write!(f, "{e}"),
            DataplaneError::Engine(e) => write!(f, "{e}"),
            DataplaneError::Thread(e) => write!(f, "starting a thread: {e}"),
            DataplaneError::Poisoned => write!(f, "a dataplane thread failed while starting"),
        }
    }
}

impl std::error::Error for DataplaneError {}

impl From<IoError> for DataplaneError {
    fn from(e: IoError) -> Self {
        DataplaneError::Io(e)
    }
}

/// One worker's state as the management API reports it.
#[derive(Debug, Clone, Default)]
pub struct WorkerSnapshot {
    pub stats: Stats,
    pub sessions_by_proto: [u32; 3],
    pub mappings_by_proto: [u32; 3],
    pub subscribers: u64,
    pub ports_in_use: u64,
    pub total_ports: u64,
    pub memory_bytes: u64,
    pub events_lost: u64,
    pub busy_ns: u64,
    pub handoff_dropped: u64,
    /// Subscribers whose port use reached 50, 80, 90 and 100% of their limit.
    pub port_use_over: [u64; 4],
    pub pcp: natrix_engine::pcp::PcpStats,
}

/// The interfaces' state.
#[derive(Debug, Clone, Default)]
pub struct IoSnapshot {
    pub rx_frames: [u64; 2],
    pub rx_bytes: [u64; 2],
    pub tx_frames: [u64; 2],
    pub tx_bytes: [u64; 2],
    pub rx_refused: [u64; 2],
    pub rx_kernel_dropped: [u64; 2],
    pub tx_dropped: [u64; 2],
    pub handoff_dropped: u64,
    pub gateway: GatewayCounters,
}

pub const PORT_USE_THRESHOLDS: [f64; 4] = [0.5, 0.8, 0.9, 1.0];

enum Command {
    Worker(Sender<WorkerSnapshot>),
    Io(Sender<IoSnapshot>),
    Sessions(Option<u32>, Sender<Vec<SessionView>>),
    Mappings(Option<u32>, Sender<Vec<MappingView>>),
    Clear(u32, Sender<Cleared>),
    Reload(Box<EngineConfig>, Sender<Result<(), String>>),
    ReloadLinks(Vec<u32>, Vec<u32>, Sender<()>),
}

struct Control {
    commands: Sender<Command>,
    doorbell: Arc<Doorbell>,
}

impl Control {
    fn ask<T>(&self, make: impl FnOnce(Sender<T>) -> Command) -> Result<T, String> {
        let (tx, rx) = mpsc::channel();
        self.commands.send(make(tx)).map_err(|_| "a dataplane thread has stopped".to_string())?;
        self.doorbell.ring_always();
        rx.recv_timeout(COMMAND_TIMEOUT).map_err(|_| "a dataplane thread did not answer".to_string())
    }
}

/// A running dataplane.
pub struct Dataplane {
    stop: Arc<AtomicBool>,
    threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
    workers: Vec<Control>,
    /// The thread that owns the interfaces (worker 0 when there is one worker).
    io: Control,
    backend: &'static str,
    notes: Vec<String>,
    events: std::sync::Mutex<Option<Receiver<Event>>>,
    outside_prefix: (u32, u8),
}

impl Dataplane {
    pub fn start(settings: Settings) -> Result<Dataplane, DataplaneError> {
        let inside_if = Interface::lookup(&settings.inside.interface)?;
        let outside_if = Interface::lookup(&settings.outside.interface)?;
        let mut notes = Vec::new();
        let inside_port = open_port(&inside_if, settings.io, &mut notes)?;
        let outside_port = open_port(&outside_if, settings.io, &mut notes)?;
        let backend = inside_port.backend();
        let mut engine_cfg = settings.engine.clone();
        engine_cfg.egress_mtu = [inside_if.mtu, outside_if.mtu];
        let gateway = Gateway::new(
            Link { mac: inside_if.mac, addr: settings.inside.addr, prefix_len: settings.inside.prefix_len, answers_for: vec![settings.inside.addr] },
            Link { mac: outside_if.mac, addr: settings.outside.addr, prefix_len: settings.outside.prefix_len, answers_for: outside_answers(&settings.outside, &engine_cfg.pool) },
            settings.gateway,
        );
        let ports = Ports { ports: [inside_port, outside_port], gateway, stage: Stage::default(), snapshot: IoSnapshot::default() };
        let (event_tx, event_rx) = mpsc::sync_channel(settings.event_buffer.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let count = settings.workers.max(1);
        let mut engines = (0..count)
            .map(|index| Engine::new(EngineConfig { shard: Shard { index, count }, ..engine_cfg.clone() }))
            .collect::<Result<Vec<_>, _>>()
            .map_err(DataplaneError::Engine)?;
        let mut ports = ports;
        if let Some(announce) = engines[0].pcp_announcement(inside_if.mac) {
            // RFC 6887 section 14.1.3: tell clients natrix (re)started, so they renew.
            ports.stage.push_addressed(Side::Inside, &announce);
        }
        let clock = Clock::new();
        let mut dp = Dataplane {
            stop: stop.clone(),
            threads: Default::default(),
            workers: Vec::new(),
            io: Control { commands: mpsc::channel().0, doorbell: Arc::new(Doorbell::new().map_err(DataplaneError::Thread)?) },
            backend,
            notes,
            events: std::sync::Mutex::new(Some(event_rx)),
            outside_prefix: (settings.outside.addr, settings.outside.prefix_len),
        };
        if count == 1 {
            dp.start_single(engines, ports, event_tx, clock, settings.busy_poll)?;
        } else {
            dp.start_sharded(engines, ports, &engine_cfg, event_tx, clock, settings.busy_poll)?;
        }
        Ok(dp)
    }

    fn start_single(&mut self, mut engines: Vec<Engine>, mut ports: Ports, event_tx: SyncSender<Event>, clock: Clock, busy_poll: bool) -> Result<(), DataplaneError> {
        let (commands, rx) = mpsc::channel();
        let doorbell = self.io.doorbell.clone();
        let engine = engines.remove(0);
        let stop = self.stop.clone();
        let mut worker = EngineWorker::new(engine, rx, event_tx);
        let bell = doorbell.clone();
        let h = spawn("natrix-w0", move || {
            ports.gateway.announce(&mut |s, f| ports.stage.push_addressed(s, f));
            run_single(&mut worker, &mut ports, &bell, &stop, clock, busy_poll);
        })?;
        self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
        self.io = Control { commands: commands.clone(), doorbell: doorbell.clone() };
        self.workers.push(Control { commands, doorbell });
        Ok(())
    }

    fn start_sharded(
        &mut self,
        engines: Vec<Engine>,
        mut ports: Ports,
        cfg: &EngineConfig,
        event_tx: SyncSender<Event>,
        clock: Clock,
        busy_poll: bool,
    ) -> Result<(), DataplaneError> {
        let count = engines.len() as u16;
        let io_bell = self.io.doorbell.clone();
        let mut lanes = Lanes::default();
        for (i, engine) in engines.into_iter().enumerate() {
            let (to_worker, worker_in) = ring::ring(RING_FRAMES);
            let (worker_out, from_worker) = ring::ring(RING_FRAMES);
            let (commands, rx) = mpsc::channel();
            let bell = Arc::new(Doorbell::new().map_err(DataplaneError::Thread)?);
            let mut worker = EngineWorker::new(engine, rx, event_tx.clone());
            let (stop, wbell, io_bell) = (self.stop.clone(), bell.clone(), io_bell.clone());
            let h = spawn(&format!("natrix-w{i}"), move || run_worker(&mut worker, worker_in, worker_out, &wbell, &io_bell, &stop, clock, busy_poll))?;
            self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
            self.workers.push(Control { commands, doorbell: bell.clone() });
            lanes.to_workers.push(to_worker);
            lanes.from_workers.push(from_worker);
            lanes.doorbells.push(bell);
        }
        let (commands, rx) = mpsc::channel();
        self.io.commands = commands;
        let steering = Steering::new(Owners::for_config(cfg, count));
        let mut pool = cfg.pool.clone();
        pool.sort_unstable();
        let stop = self.stop.clone();
        let h = spawn("natrix-io", move || {
            ports.gateway.announce(&mut |s, f| ports.stage.push_addressed(s, f));
            let mut io = IoThread { ports, lanes, steering, pool, commands: rx };
            io.run(&io_bell, &stop, clock, busy_poll);
        })?;
        self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
        Ok(())
    }

    /// "af_xdp" or "af_packet".
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Why a backend other than the one asked for is in use, and the like.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The NAT events (mappings created and deleted, ...), for the logger;
    /// there is one receiver and this hands it over once.
    pub fn take_events(&self) -> Option<Receiver<Event>> {
        self.events.lock().ok()?.take()
    }

    pub fn worker_snapshots(&self) -> Result<Vec<WorkerSnapshot>, String> {
        self.workers.iter().map(|w| w.ask(Command::Worker)).collect()
    }

    pub fn io_snapshot(&self) -> Result<IoSnapshot, String> {
        self.io.ask(Command::Io)
    }

    pub fn sessions(&self, subscriber: Option<u32>) -> Result<Vec<SessionView>, String> {
        Ok(self.workers.iter().map(|w| w.ask(|tx| Command::Sessions(subscriber, tx))).collect::<Result<Vec<_>, _>>()?.concat())
    }

    pub fn mappings(&self, subscriber: Option<u32>) -> Result<Vec<MappingView>, String> {
        Ok(self.workers.iter().map(|w| w.ask(|tx| Command::Mappings(subscriber, tx))).collect::<Result<Vec<_>, _>>()?.concat())
    }

    pub fn clear_subscriber(&self, addr: u32) -> Result<Cleared, String> {
        let mut total = Cleared::default();
        for w in &self.workers {
            let c = w.ask(|tx| Command::Clear(addr, tx))?;
            total.sessions += c.sessions;
            total.mappings += c.mappings;
        }
        Ok(total)
    }

    /// Applies a reloaded engine configuration to every worker. Every worker
    /// holds the same configuration, so they all accept or all refuse; the
    /// first refusal is returned and nothing changes.
    pub fn reload(&self, cfg: &EngineConfig) -> Result<(), String> {
        for w in &self.workers {
            w.ask(|tx| Command::Reload(Box::new(cfg.clone()), tx))??;
        }
        let outside = LinkSettings { interface: String::new(), addr: self.outside_prefix.0, prefix_len: self.outside_prefix.1 };
        let mut pool = cfg.pool.clone();
        pool.sort_unstable();
        self.io.ask(|tx| Command::ReloadLinks(outside_answers(&outside, &cfg.pool), pool, tx))
    }

    /// Stops every thread and waits for them; later calls do nothing.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers.iter().chain(std::iter::once(&self.io)) {
            w.doorbell.ring_always();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for h in threads {
            let _ = h.join();
        }
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// natrix answers ARP on the outside for its own address and for pool
/// addresses inside the outside prefix (routed pool addresses need no ARP).
fn outside_answers(outside: &LinkSettings, pool: &[u32]) -> Vec<u32> {
    let mut v = vec![outside.addr];
    v.extend(pool.iter().copied().filter(|&a| prefix_contains(outside.addr, outside.prefix_len, a)));
    v
}

fn open_port(iface: &Interface, choice: IoChoice, notes: &mut Vec<String>) -> Result<Box<dyn PacketPort>, DataplaneError> {
    match choice {
        IoChoice::AfPacket => Ok(Box::new(AfPacketPort::open(iface)?)),
        IoChoice::AfXdp => Ok(Box::new(AfXdpPort::open(&iface.name)?)),
        IoChoice::Auto => match AfXdpPort::open(&iface.name) {
            Ok(p) => Ok(Box::new(p)),
            Err(e) => {
                notes.push(format!("AF_XDP unavailable ({e}); using AF_PACKET on {}", iface.name));
                Ok(Box::new(AfPacketPort::open(iface)?))
            }
        },
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, DataplaneError> {
    std::thread::Builder::new().name(name.to_owned()).spawn(f).map_err(DataplaneError::Thread)
}

/// Engine time: Unix nanoseconds that never go backwards, so events carry
/// wall-clock times while timers follow the monotonic clock.
#[derive(Clone, Copy)]
struct Clock {
    start: Instant,
    unix_at_start_ns: u64,
}

impl Clock {
    fn new() -> Clock {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Clock { start: Instant::now(), unix_at_start_ns: unix }
    }

    fn now_ns(&self) -> u64 {
        self.unix_at_start_ns + self.start.elapsed().as_nanos() as u64
    }
}

/// Frames of one round, sent once the receive ring is released: received
/// frames waiting for the engine (translated in place, as a batch), and
/// frames to send.
#[derive(Default)]
struct Stage {
    bytes: Vec<u8>,
    /// Side, offset, length, and what becomes of the frame.
    frames: Vec<(Side, usize, usize, Next)>,
}

/// What becomes of a staged frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Waits for the engine, which decides its fate.
    Translate,
    /// Goes to its next hop (forwarded or generated by the NAT).
    Route,
    /// Already addressed (ARP from the gateway): sent as it is.
    Send,
    /// Dropped or held by the engine: not sent.
    Nothing,
}

impl Stage {
    /// A received frame for the engine: translated in place before it is sent.
    fn hold(&mut self, side: Side, frame: &[u8]) {
        self.add(side, frame, Next::Translate);
    }

    /// A frame the NAT forwards or generates: it goes to its next hop.
    fn push(&mut self, side: Side, frame: &[u8]) {
        self.add(side, frame, Next::Route);
    }

    /// A frame already addressed (ARP from the gateway).
    fn push_addressed(&mut self, side: Side, frame: &[u8]) {
        self.add(side, frame, Next::Send);
    }

    fn add(&mut self, side: Side, frame: &[u8], next: Next) {
        self.frames.push((side, self.bytes.len(), frame.len(), next));
        self.bytes.extend_from_slice(frame);
    }

    /// Hands the frames waiting for the engine to `translate`, up to
    /// `MAX_POP` at a time with their sides, each writable in place; the
    /// verdicts it writes decide which are sent and where.
    fn translate_held(&mut self, mut translate: impl FnMut(&[Side], &mut [&mut [u8]], &mut [Verdict])) {
        let Stage { bytes, frames } = self;
        let mut first = 0;
        while let Some(start) = frames[first..].iter().position(|f| f.3 == Next::Translate).map(|i| first + i) {
            let mut sides = [Side::Inside; MAX_POP];
            let mut slots = [0usize; MAX_POP];
            let mut views: [&mut [u8]; MAX_POP] = std::array::from_fn(|_| &mut [][..]);
            let (mut rest, mut rest_at) = (&mut bytes[..], 0);
            let mut n = 0;
            for (i, &(side, at, len, next)) in frames.iter().enumerate().skip(start) {
                if n == MAX_POP {
                    break;
                }
                if next != Next::Translate {
                    continue;
                }
                // Staged frames lie in order and apart: split each off the rest.
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(at - rest_at);
                let (frame, tail) = tail.split_at_mut(len);
                (rest, rest_at) = (tail, at + len);
                (sides[n], slots[n], views[n]) = (side, i, frame);
                n += 1;
            }
            let mut verdicts = [Verdict::Held; MAX_POP];
            translate(&sides[..n], &mut views[..n], &mut verdicts[..n]);
            for (&i, v) in slots[..n].iter().zip(&verdicts[..n]) {
                let f = &mut frames[i];
                (f.0, f.3) = match *v {
                    Verdict::Forward(to) => (to, Next::Route),
                    _ => (f.0, Next::Nothing),
                };
            }
            first = slots[n - 1] + 1;
        }
    }
}

/// Both interfaces, the router state around them, and their counters.
struct Ports {
    ports: [Box<dyn PacketPort>; 2],
    gateway: Gateway,
    stage: Stage,
    snapshot: IoSnapshot,
}

impl Ports {
    /// Receives a batch on `side`; `f` gets each IPv4 frame for the NAT and
    /// may stage frames to send.
    fn receive(&mut self, side: Side, now: u64, f: &mut dyn FnMut(&mut [u8], &mut Stage)) -> usize {
        let Ports { ports, gateway, stage, snapshot } = self;
        let s = side as usize;
        ports[s]
            .recv_batch(BATCH, &mut |frame| {
                snapshot.rx_frames[s] += 1;
                snapshot.rx_bytes[s] += frame.len() as u64;
                if gateway.ingress(side, frame, now, &mut |out, f| stage.push_addressed(out, f)) == Ingress::Engine {
                    f(frame, stage);
                }
            })
            .unwrap_or(0)
    }

    /// Sends a frame through the next-hop logic.
    fn send(&mut self, side: Side, frame: &mut [u8], now: u64) {
        let Ports { ports, gateway, snapshot, .. } = self;
        gateway.egress(side, frame, now, &mut |out, f| transmit(ports, snapshot, out, f));
    }

    /// Sends every staged frame and kicks both interfaces.
    fn flush(&mut self, now: u64) {
        let mut stage = std::mem::take(&mut self.stage);
        for &(side, at, len, next) in &stage.frames {
            debug_assert_ne!(next, Next::Translate, "flush: a received frame was never translated");
            let frame = &mut stage.bytes[at..at + len];
            match next {
                Next::Route => self.send(side, frame, now),
                Next::Send => transmit(&mut self.ports, &mut self.snapshot, side, frame),
                Next::Translate | Next::Nothing => {}
            }
        }
        stage.frames.clear();
        stage.bytes.clear();
        self.stage = stage;
        for p in &mut self.ports {
            let _ = p.flush();
        }
        self.gateway.expire(now);
    }

    fn snapshot(&mut self) -> IoSnapshot {
        let mut s = self.snapshot.clone();
        for (i, p) in self.ports.iter_mut().enumerate() {
            s.rx_kernel_dropped[i] = p.kernel_dropped();
            s.rx_refused[i] = p.dropped_on_receive();
            s.tx_dropped[i] += p.dropped_on_transmit();
        }
        s.gateway = self.gateway.counters.clone();
        s
    }

    fn fds(&self) -> [i32; 2] {
        [self.ports[0].fd(), self.ports[1].fd()]
    }
}

fn transmit(ports: &mut [Box<dyn PacketPort>; 2], snapshot: &mut IoSnapshot, side: Side, frame: &[u8]) {
    let s = side as usize;
    if ports[s].send(frame) {
        snapshot.tx_frames[s] += 1;
        snapshot.tx_bytes[s] += frame.len() as u64;
    } else {
        snapshot.tx_dropped[s] += 1;
    }
}

/// A worker's engine and its links to the control plane.
struct EngineWorker {
    engine: Engine,
    commands: Receiver<Command>,
    events: SyncSender<Event>,
    events_lost: u64,
    busy_ns: u64,
    handoff_dropped: u64,
}

impl EngineWorker {
    fn new(engine: Engine, commands: Receiver<Command>, events: SyncSender<Event>) -> EngineWorker {
        EngineWorker { engine, commands, events, events_lost: 0, busy_ns: 0, handoff_dropped: 0 }
    }

    /// Translates a batch of frames, `sides[i]` the side `frames[i]` arrived
    /// on, through the engine's batch path (prefetch across the batch), a
    /// run of frames from one side at a time so their order holds;
    /// `verdicts[i]` says what became of `frames[i]`.
    fn translate_batch(&mut self, sides: &[Side], frames: &mut [&mut [u8]], now: u64, verdicts: &mut [Verdict]) {
        let mut start = 0;
        while start < frames.len() {
            let side = sides[start];
            let end = start + sides[start..].iter().take_while(|&&s| s == side).count();
            self.engine.process_batch(&mut frames[start..end], side, now, &mut verdicts[start..end]);
            start = end;
        }
    }

    /// Work done between batches: timers, generated frames, events.
    fn housekeeping(&mut self, now: u64, out: &mut impl FnMut(Side, &[u8])) {
        self.engine.advance(now);
        self.engine.drain_output(|o| out(o.side, &o.data));
        let (events, lost) = (&self.events, &mut self.events_lost);
        self.engine.drain_events(|e| {
            // Disconnected means no log is configured: nothing is lost.
            if let Err(TrySendError::Full(_)) = events.try_send(e) {
                *lost += 1;
            }
        });
    }

    fn command(&mut self, cmd: Command, io: Option<&mut Ports>) {
        match cmd {
            Command::Worker(tx) => {
                let _ = tx.send(self.snapshot());
            }
            Command::Sessions(sub, tx) => {
                let _ = tx.send(self.engine.session_views(sub));
            }
            Command::Mappings(sub, tx) => {
                let _ = tx.send(self.engine.mapping_views(sub));
            }
            Command::Clear(addr, tx) => {
                let _ = tx.send(self.engine.clear_subscriber(addr));
            }
            Command::Reload(cfg, tx) => {
                let mut cfg = *cfg;
                cfg.egress_mtu = self.engine.config().egress_mtu;
                let _ = tx.send(self.engine.reconfigure(cfg));
            }
            Command::Io(tx) => {
                let _ = tx.send(io.map(|p| p.snapshot()).unwrap_or_default());
            }
            Command::ReloadLinks(answers, _, tx) => {
                if let Some(p) = io {
                    p.gateway.set_answers_for(Side::Outside, answers);
                }
                let _ = tx.send(());
            }
        }
    }

    /// At a clean stop: end every mapping and hand the logger every deletion,
    /// waiting for it this once (the packet path has stopped).
    fn finish(&mut self) {
        self.engine.release_all();
        let events = &self.events;
        self.engine.drain_events(|e| {
            let _ = events.send(e);
        });
    }

    fn snapshot(&self) -> WorkerSnapshot {
        let e = &self.engine;
        let limit = f64::from(e.config().max_ports_per_subscriber.max(1));
        let mut over = [0u64; 4];
        for (_, s) in e.subscribers().iter() {
            let used = f64::from(s.ports_total()) / limit;
            for (o, &t) in over.iter_mut().zip(&PORT_USE_THRESHOLDS) {
                *o += u64::from(used >= t);
            }
        }
        WorkerSnapshot {
            stats: e.stats().clone(),
            sessions_by_proto: e.tables().sessions_by_proto(),
            mappings_by_proto: e.tables().mappings_by_proto(),
            subscribers: e.subscribers().len() as u64,
            ports_in_use: e.pool().ports_in_use(),
            total_ports: e.pool().total_ports(),
            memory_bytes: e.memory_bytes() as u64,
            events_lost: self.events_lost + e.events_lost(),
            busy_ns: self.busy_ns,
            handoff_dropped: self.handoff_dropped,
            port_use_over: over,
            pcp: e.pcp_stats(),
        }
    }
}

/// Decides when an idle thread sleeps.
struct Idle {
    spins: u32,
    busy_poll: bool,
}

impl Idle {
    fn should_sleep(&mut self, did_work: bool) -> bool {
        if did_work {
            self.spins = 0;
            return false;
        }
        self.spins += 1;
        !self.busy_poll && self.spins > SPINS_BEFORE_SLEEP
    }
}

fn run_single(worker: &mut EngineWorker, ports: &mut Ports, bell: &Doorbell, stop: &AtomicBool, clock: Clock, busy_poll: bool) {
    let mut idle = Idle { spins: 0, busy_poll };
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let now = clock.now_ns();
        let mut n = 0;
        for side in [Side::Inside, Side::Outside] {
            n += ports.receive(side, now, &mut |frame, stage| stage.hold(side, frame));
        }
        ports.stage.translate_held(|sides, frames, verdicts| worker.translate_batch(sides, frames, now, verdicts));
        worker.housekeeping(now, &mut |to, f| ports.stage.push(to, f));
        while let Ok(cmd) = worker.commands.try_recv() {
            worker.command(cmd, Some(ports));
        }
        ports.flush(now);
        if n > 0 {
            worker.busy_ns += t0.elapsed().as_nanos() as u64;
        }
        if idle.should_sleep(n > 0) {
            bell.going_to_sleep();
            let [a, b] = ports.fds();
            wait_readable(&[a, b, bell.fd()], SLEEP_MS);
            bell.woke();
        }
    }
    worker.finish();
}

#[allow(clippy::too_many_arguments)]
fn run_worker(worker: &mut EngineWorker, mut input: Consumer, mut output: Producer, bell: &Doorbell, io_bell: &Doorbell, stop: &AtomicBool, clock: Clock, busy_poll: bool) {
    let mut idle = Idle { spins: 0, busy_poll };
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let now = clock.now_ns();
        let mut dropped = 0;
        let n = input.pop_batch(|sides, frames| {
            let mut verdicts = [Verdict::Held; MAX_POP];
            let verdicts = &mut verdicts[..frames.len()];
            worker.translate_batch(sides, frames, now, verdicts);
            for (frame, v) in frames.iter().zip(verdicts.iter()) {
                if let Verdict::Forward(to) = *v {
                    dropped += u64::from(!output.push(to, frame));
                }
            }
        });
        let mut pushed = n > 0;
        worker.housekeeping(now, &mut |to, f| {
            pushed = true;
            dropped += u64::from(!output.push(to, f));
        });
        worker.handoff_dropped += dropped;
        while let Ok(cmd) = worker.commands.try_recv() {
            worker.command(cmd, None);
        }
        if pushed {
            // Frames from timers (held SYN answers) count too.
            io_bell.ring();
        }
        if n > 0 {
            worker.busy_ns += t0.elapsed().as_nanos() as u64;
        }
        if idle.should_sleep(n > 0) {
            bell.going_to_sleep();
            if input.is_empty() {
                wait_readable(&[bell.fd()], SLEEP_MS);
            }
            bell.woke();
        }
    }
    worker.finish();
}

/// The I/O thread's links to the workers, one entry per worker in each:
/// kept apart so a frame popped from one worker can go straight to another.
#[derive(Default)]
struct Lanes {
    to_workers: Vec<Producer>,
    from_workers: Vec<Consumer>,
    doorbells: Vec<Arc<Doorbell>>,
}

struct IoThread {
    ports: Ports,
    lanes: Lanes,
    steering: Steering,
    /// Sorted, to recognise hairpins a worker handed back.
    pool: Vec<u32>,
    commands: Receiver<Command>,
}

impl IoThread {
    fn run(&mut self, bell: &Doorbell, stop: &AtomicBool, clock: Clock, busy_poll: bool) {
        let mut idle = Idle { spins: 0, busy_poll };
        let mut woken = vec![false; self.lanes.to_workers.len()];
        while !stop.load(Ordering::Relaxed) {
            let now = clock.now_ns();
            let mut n = 0;
            for side in [Side::Inside, Side::Outside] {
                let IoThread { ports, lanes, steering, .. } = self;
                let mut dropped = 0;
                n += ports.receive(side, now, &mut |frame, _| {
                    let w = usize::from(steering.worker_for(side, frame));
                    if lanes.to_workers[w].push(side, frame) {
                        woken[w] = true;
                    } else {
                        dropped += 1;
                    }
                });
                ports.snapshot.handoff_dropped += dropped;
            }
            n += self.collect_from_workers(now, &mut woken);
            for (bell, w) in self.lanes.doorbells.iter().zip(woken.iter_mut()) {
                if std::mem::take(w) {
                    bell.ring();
                }
            }
            self.ports.flush(now);
            while let Ok(cmd) = self.commands.try_recv() {
                self.command(cmd);
            }
            if idle.should_sleep(n > 0) {
                bell.going_to_sleep();
                if self.lanes.from_workers.iter().all(Consumer::is_empty) {
                    let [a, b] = self.ports.fds();
                    wait_readable(&[a, b, bell.fd()], SLEEP_MS);
                }
                bell.woke();
            }
        }
    }

    /// Sends what the workers translated; a frame leaving outside for a pool
    /// address is a hairpin between workers and goes back in to the owner.
    fn collect_from_workers(&mut self, now: u64, woken: &mut [bool]) -> usize {
        let mut n = 0;
        let IoThread { ports, lanes, steering, pool, .. } = self;
        let Lanes { to_workers, from_workers, .. } = lanes;
        for from in from_workers.iter_mut() {
            // Each worker gets the same budget, so one backlog cannot starve the others.
            let mut budget = BATCH;
            while budget > 0
                && from.pop(|side, frame| {
                    if side == Side::Outside && is_to_pool(frame, pool) {
                        let w = steering.hairpin_owner(frame).map(usize::from);
                        match w {
                            Some(w) if to_workers[w].push(Side::Outside, frame) => woken[w] = true,
                            _ => ports.snapshot.handoff_dropped += 1,
                        }
                    } else {
                        ports.send(side, frame, now);
                    }
                })
            {
                budget -= 1;
                n += 1;
            }
        }
        n
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Io(tx) => {
                let _ = tx.send(self.ports.snapshot());
            }
            Command::ReloadLinks(answers, pool, tx) => {
                self.ports.gateway.set_answers_for(Side::Outside, answers);
                self.pool = pool;
                let _ = tx.send(());
            }
            _ => {}
        }
    }
}

fn is_to_pool(frame: &[u8], pool: &[u32]) -> bool {
    let Ok(eth) = natrix_wire::ethernet::Frame::new_checked(frame) else { return false };
    let l3 = eth.payload_offset();
    frame.len() >= l3 + 20 && pool.binary_search(&natrix_wire::get_u32_at(frame, l3 + 16)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Received frames, interleaved with gateway frames, more than one batch
    /// of them: each is translated once, in order, in place, and its verdict
    /// decides where it goes; the gateway's frames are left as they are.
    #[test]
    fn held_frames_are_translated_in_place_in_batches_and_keep_their_order() {
        let mut stage = Stage::default();
        for i in 0..150u8 {
            stage.hold(if i < 100 { Side::Inside } else { Side::Outside }, &[i; 70]);
            if i % 50 == 0 {
                stage.push_addressed(Side::Outside, &[0xaa; 42]);
            }
            if i % 70 == 0 {
                stage.push(Side::Inside, &[0xbb; 50]);
            }
        }
        let mut seen = Vec::new();
        stage.translate_held(|sides, frames, verdicts| {
            assert!(frames.len() <= MAX_POP);
            for ((side, frame), v) in sides.iter().zip(frames.iter_mut()).zip(verdicts.iter_mut()) {
                let i = frame[0];
                assert_eq!(*frame, &[i; 70][..]);
                assert_eq!(*side == Side::Inside, i < 100);
                seen.push(i);
                frame[1] = 0xee;
                *v = if i % 3 == 0 { Verdict::Drop(natrix_engine::DropReason::NoMapping) } else { Verdict::Forward(side.other()) };
            }
        });
        assert_eq!(seen, (0..150).collect::<Vec<u8>>());
        let mut held = 0;
        for &(side, at, len, next) in &stage.frames {
            let f = &stage.bytes[at..at + len];
            if f[0] == 0xaa {
                assert_eq!((side, len, next), (Side::Outside, 42, Next::Send));
                continue;
            }
            if f[0] == 0xbb {
                assert_eq!((side, len, next), (Side::Inside, 50, Next::Route));
                continue;
            }
            let i = f[0];
            assert_eq!(f[1], 0xee, "frame {i} translated in place");
            let arrived = if i < 100 { Side::Inside } else { Side::Outside };
            let want = if i % 3 == 0 { (arrived, Next::Nothing) } else { (arrived.other(), Next::Route) };
            assert_eq!((side, next), want, "frame {i}");
            held += 1;
        }
        assert_eq!(held, 150);
    }
}
