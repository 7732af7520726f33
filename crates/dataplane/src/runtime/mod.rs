//! The threads of a running natrix and the handle that controls them.
//!
//! With one worker, one thread does everything for a frame: receive, ARP,
//! translate where the frame lies, next hop, transmit. With N workers there
//! are N threads: the first also owns both interfaces and the ARP state,
//! translates its own frames where they lie, steers every other IP frame to
//! the worker that owns its state over a lock-free ring, and transmits what
//! the workers hand back; each worker owns one engine and never takes a
//! lock per packet. Operators reach the threads through command channels
//! that are checked between batches, so the packet path has no shared state.
//!
//! The parts: this file starts the threads and is the handle (`Dataplane`);
//! `links` holds both interfaces with the router state around them, `stage`
//! the frames of one round, `worker` the engines' threads, `io_thread` the
//! first worker, which also steers between workers, `commands` the
//! operators' requests, and `clock` time and idling.

mod clock;
mod commands;
mod io_thread;
mod links;
mod stage;
mod worker;

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use natrix_engine::admin::{Cleared, MappingView, SessionView};
use natrix_engine::config::prefix_contains;
use natrix_engine::pipeline::hooks::FunctionRecord;
use natrix_engine::shard::{Owners, Shard};
use natrix_engine::{Engine, EngineConfig, Event, Side, Stats};
use natrix_io::af_packet::AfPacketPort;
use natrix_io::af_xdp::{XdpMode, XdpPorts};
use natrix_io::iface::Interface;
use natrix_io::{check_frames_fit, CopyingPorts, FramePorts, IoError, PacketPort};

use crate::gateway::{Gateway, GatewayCounters, Link};
use crate::ring::{self, Doorbell};
use crate::steer::Steering;
use clock::Clock;
use commands::{Command, Control};
pub use commands::{ControlError, SyncTally};
use io_thread::{IoThread, Lanes};
use links::Links;
use worker::{run_single, run_worker, EngineWorker};

/// Frames received from one interface per round.
const BATCH: usize = 64;
const RING_FRAMES: usize = 4096;

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
    /// The engines' configuration; its `inside_addr6` and `outside_addr6`
    /// are natrix's IPv6 addresses on the links (NDP, IPv6 next hops).
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

/// A port the caller opened for one side, with what natrix would otherwise
/// read from the interface: tests hand the dataplane `MemoryPort`s this way.
pub struct SuppliedPort {
    pub port: Box<dyn PacketPort>,
    pub mac: [u8; 6],
    /// The link's MTU, for the engine's egress checks (0: no limit).
    pub mtu: u16,
}

/// What `start_with` takes beyond `Settings`.
#[derive(Default)]
pub struct StartOptions {
    /// `[outside] gateway6`: the IPv6 next hop for destinations off the
    /// outside `address6` prefix.
    pub gateway6: Option<Ipv6Addr>,
    /// Ports for the inside and the outside; None opens the interfaces
    /// `Settings` names with the backend it chooses.
    pub ports: Option<[SuppliedPort; 2]>,
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
    pub sessions_by_proto: [u32; natrix_engine::Proto::COUNT],
    pub mappings_by_proto: [u32; natrix_engine::Proto::COUNT],
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
    /// System calls of the thread that owns the interfaces: to make the
    /// kernel transmit, to make it receive, and to wait for frames (poll).
    pub transmit_calls: u64,
    pub receive_calls: u64,
    pub wait_calls: u64,
}

pub const PORT_USE_THRESHOLDS: [f64; 4] = [0.5, 0.8, 0.9, 1.0];

/// A running dataplane.
/// What the workers hand the logger: NAT's events and the middlebox
/// functions' records (HOST_ID's policy events).
#[derive(Debug, Clone)]
pub enum Logged {
    Nat(Event),
    Function(FunctionRecord),
}

pub struct Dataplane {
    stop: Arc<AtomicBool>,
    threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
    workers: Vec<Control>,
    /// The thread that owns the interfaces (worker 0 when there is one worker).
    io: Control,
    backend: &'static str,
    notes: Vec<String>,
    events: std::sync::Mutex<Option<Receiver<Logged>>>,
    outside_prefix: (u32, u8),
}

impl Dataplane {
    /// Opens the interfaces `settings` names and starts the threads.
    pub fn start(settings: Settings) -> Result<Dataplane, DataplaneError> {
        Dataplane::start_with(settings, StartOptions::default())
    }

    /// Starts the threads, on the ports `options` supplies or else on the
    /// interfaces `settings` names.
    pub fn start_with(settings: Settings, options: StartOptions) -> Result<Dataplane, DataplaneError> {
        let mut notes = Vec::new();
        let (ports, [inside, outside]) = match options.ports {
            Some([inside, outside]) => {
                let ports: Box<dyn FramePorts> = Box::new(CopyingPorts::new([inside.port, outside.port]));
                (ports, [LinkLayer { mac: inside.mac, mtu: inside.mtu }, LinkLayer { mac: outside.mac, mtu: outside.mtu }])
            }
            None => open_interfaces(&settings, &mut notes)?,
        };
        let backend = ports.backend();
        let mut engine_cfg = settings.engine.clone();
        engine_cfg.egress_mtu = [inside.mtu, outside.mtu];
        let gateway = Gateway::new(
            Link {
                mac: inside.mac,
                addr: settings.inside.addr,
                prefix_len: settings.inside.prefix_len,
                answers_for: vec![settings.inside.addr],
                addr6: engine_cfg.inside_addr6,
                answers_for6: engine_cfg.dslite.iter().map(|d| d.aftr).collect(),
            },
            Link {
                mac: outside.mac,
                addr: settings.outside.addr,
                prefix_len: settings.outside.prefix_len,
                answers_for: outside_answers(&settings.outside, &engine_cfg.pool),
                addr6: engine_cfg.outside_addr6,
                answers_for6: Vec::new(),
            },
            settings.gateway,
            options.gateway6,
        );
        let mut links = Links::new(ports, gateway);
        let (event_tx, event_rx) = mpsc::sync_channel(settings.event_buffer.max(1));
        let count = settings.workers.max(1);
        let mut engines = (0..count)
            .map(|index| Engine::new(EngineConfig { shard: Shard { index, count }, ..engine_cfg.clone() }))
            .collect::<Result<Vec<_>, _>>()
            .map_err(DataplaneError::Engine)?;
        if let Some(announce) = engines[0].pcp_announcement(inside.mac) {
            // RFC 6887 section 14.1.3: tell clients natrix (re)started, so they renew.
            links.stage.push_addressed(Side::Inside, &announce);
        }
        let clock = Clock::new();
        let mut dp = Dataplane {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Default::default(),
            workers: Vec::new(),
            io: Control::new(mpsc::channel().0, Arc::new(Doorbell::new().map_err(DataplaneError::Thread)?)),
            backend,
            notes,
            events: std::sync::Mutex::new(Some(event_rx)),
            outside_prefix: (settings.outside.addr, settings.outside.prefix_len),
        };
        if count == 1 {
            dp.start_single(engines, links, event_tx, clock, settings.busy_poll)?;
        } else {
            dp.start_sharded(engines, links, &engine_cfg, event_tx, clock, settings.busy_poll)?;
        }
        Ok(dp)
    }

    fn start_single(&mut self, mut engines: Vec<Engine>, mut links: Links, event_tx: SyncSender<Logged>, clock: Clock, busy_poll: bool) -> Result<(), DataplaneError> {
        let (commands, rx) = mpsc::channel();
        let doorbell = self.io.doorbell.clone();
        let engine = engines.remove(0);
        let stop = self.stop.clone();
        let mut worker = EngineWorker::new(engine, rx, event_tx);
        let bell = doorbell.clone();
        let h = spawn("natrix-w0", move || {
            links.announce();
            run_single(&mut worker, &mut links, &bell, &stop, clock, busy_poll);
        })?;
        self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
        self.io = Control::new(commands.clone(), doorbell.clone());
        self.workers.push(Control::new(commands, doorbell));
        Ok(())
    }

    /// Worker 0 owns the interfaces and steers; workers 1.. take their
    /// frames from it over rings and hand them back.
    fn start_sharded(&mut self, engines: Vec<Engine>, links: Links, cfg: &EngineConfig, event_tx: SyncSender<Logged>, clock: Clock, busy_poll: bool) -> Result<(), DataplaneError> {
        let count = engines.len() as u16;
        let io_bell = self.io.doorbell.clone();
        let mut lanes = Lanes::default();
        let mut engines = engines.into_iter();
        let first = engines.next().expect("at least one engine");
        let frames = links.ports.shared();
        let (to_first, own_input) = ring::ring(RING_FRAMES, frames.clone());
        lanes.to_workers.push(to_first);
        for (i, engine) in engines.enumerate() {
            let (to_worker, worker_in) = ring::ring(RING_FRAMES, frames.clone());
            let (worker_out, from_worker) = ring::ring(RING_FRAMES, frames.clone());
            let (commands, rx) = mpsc::channel();
            let bell = Arc::new(Doorbell::new().map_err(DataplaneError::Thread)?);
            let mut worker = EngineWorker::new(engine, rx, event_tx.clone());
            let (stop, wbell, io_bell) = (self.stop.clone(), bell.clone(), io_bell.clone());
            let h = spawn(&format!("natrix-w{}", i + 1), move || run_worker(&mut worker, worker_in, worker_out, &wbell, &io_bell, &stop, clock, busy_poll))?;
            self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
            self.workers.push(Control::new(commands, bell.clone()));
            lanes.to_workers.push(to_worker);
            lanes.from_workers.push(from_worker);
            lanes.doorbells.push(bell);
        }
        let (commands, rx) = mpsc::channel();
        self.io.commands = commands.clone();
        self.workers.insert(0, Control::new(commands, io_bell.clone()));
        let steering = Steering::new(Owners::for_config(cfg, count), cfg.translate).with_sctp(&cfg.sctp);
        let mut pool = cfg.pool.clone();
        pool.sort_unstable();
        let stop = self.stop.clone();
        let worker = EngineWorker::new(first, rx, event_tx);
        let h = spawn("natrix-w0", move || {
            let mut io = IoThread { worker, links, lanes, own_input, steering, pool, handoffs: Vec::with_capacity(BATCH) };
            io.links.announce();
            io.run(&io_bell, &stop, clock, busy_poll);
        })?;
        self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
        Ok(())
    }

    /// "af_xdp", "af_packet", or the backend of the ports supplied.
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

    /// The NAT events (mappings created and deleted, ...) and the
    /// functions' records, for the logger;
    /// there is one receiver and this hands it over once.
    pub fn take_events(&self) -> Option<Receiver<Logged>> {
        self.events.lock().ok()?.take()
    }

    pub fn worker_snapshots(&self) -> Result<Vec<WorkerSnapshot>, ControlError> {
        self.workers.iter().map(|w| w.ask(Command::Worker)).collect()
    }

    pub fn io_snapshot(&self) -> Result<IoSnapshot, ControlError> {
        self.io.ask(Command::Io)
    }

    pub fn sessions(&self, subscriber: Option<u32>) -> Result<Vec<SessionView>, ControlError> {
        Ok(self.workers.iter().map(|w| w.ask(|tx| Command::Sessions(subscriber, tx))).collect::<Result<Vec<_>, _>>()?.concat())
    }

    pub fn mappings(&self, subscriber: Option<u32>) -> Result<Vec<MappingView>, ControlError> {
        Ok(self.workers.iter().map(|w| w.ask(|tx| Command::Mappings(subscriber, tx))).collect::<Result<Vec<_>, _>>()?.concat())
    }

    pub fn clear_subscriber(&self, addr: u32) -> Result<Cleared, ControlError> {
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
    pub fn reload(&self, cfg: &EngineConfig) -> Result<(), ControlError> {
        for w in &self.workers {
            w.ask(|tx| Command::Reload(Box::new(cfg.clone()), tx))?.map_err(ControlError::Refused)?;
        }
        let outside = LinkSettings { interface: String::new(), addr: self.outside_prefix.0, prefix_len: self.outside_prefix.1 };
        let mut pool = cfg.pool.clone();
        pool.sort_unstable();
        self.io.ask(|tx| Command::ReloadLinks(outside_answers(&outside, &cfg.pool), pool, tx))
    }

    /// Installs the cluster's active node's events (session sync), each on
    /// the worker that owns its subscriber, as the active node's worker did
    /// (a cluster's partners run the same number of workers).
    pub fn install_synced(&self, events: &[Event]) -> Result<SyncTally, ControlError> {
        let count = self.workers.len() as u16;
        let mut by_worker: Vec<Vec<Event>> = vec![Vec::new(); self.workers.len()];
        for e in events {
            by_worker[usize::from(natrix_engine::shard::worker_of_subscriber(e.int_addr, count))].push(*e);
        }
        let mut total = SyncTally::default();
        for (w, batch) in self.workers.iter().zip(by_worker).filter(|(_, b)| !b.is_empty()) {
            let t = w.ask(|tx| Command::InstallSynced(batch, tx))?;
            total.installed += t.installed;
            total.refused += t.refused;
        }
        Ok(total)
    }

    /// Makes every worker a cluster standby or an active node (`Engine::set_standby`).
    pub fn set_standby(&self, standby: bool) -> Result<(), ControlError> {
        self.workers.iter().try_for_each(|w| w.ask(|tx| Command::SetStandby(standby, tx)))
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

/// What natrix reads from an interface besides its frames.
struct LinkLayer {
    mac: [u8; 6],
    /// For the engine's egress checks (0: no limit).
    mtu: u16,
}

/// Opens both interfaces with the backend `settings` asks for; both are
/// looked up before either is opened.
fn open_interfaces(settings: &Settings, notes: &mut Vec<String>) -> Result<(Box<dyn FramePorts>, [LinkLayer; 2]), DataplaneError> {
    let inside = Interface::lookup(&settings.inside.interface)?;
    let outside = Interface::lookup(&settings.outside.interface)?;
    for iface in [&inside, &outside] {
        check_frames_fit(&iface.name, iface.mtu)?;
    }
    let ports = open_ports(&inside, &outside, settings, notes)?;
    Ok((ports, [LinkLayer { mac: inside.mac, mtu: inside.mtu }, LinkLayer { mac: outside.mac, mtu: outside.mtu }]))
}

fn open_ports(inside: &Interface, outside: &Interface, settings: &Settings, notes: &mut Vec<String>) -> Result<Box<dyn FramePorts>, DataplaneError> {
    let af_packet = || -> Result<Box<dyn FramePorts>, DataplaneError> {
        let ports: [Box<dyn PacketPort>; 2] = [Box::new(AfPacketPort::open(inside)?), Box::new(AfPacketPort::open(outside)?)];
        Ok(Box::new(CopyingPorts::new(ports)))
    };
    let af_xdp = || XdpPorts::open(&[&inside.name, &outside.name]);
    match settings.io {
        IoChoice::AfPacket => af_packet(),
        IoChoice::AfXdp => Ok(Box::new(described(af_xdp()?, notes))),
        IoChoice::Auto => match af_xdp() {
            Ok(p) => Ok(Box::new(described(p, notes))),
            Err(e) => {
                notes.push(format!("AF_XDP unavailable ({e}); using AF_PACKET on {} and {}", inside.name, outside.name));
                af_packet()
            }
        },
    }
}

/// Notes how the AF_XDP sockets were bound, for the start-up report.
fn described(ports: XdpPorts, notes: &mut Vec<String>) -> XdpPorts {
    let mode = match ports.mode() {
        XdpMode::Copy => "copy mode (the drivers have no zero-copy)",
        XdpMode::ZeroCopy => "zero-copy",
    };
    notes.push(format!("AF_XDP in {mode}: one UMEM for {} inside and {} outside receive queues, frames forwarded where they lie", ports.queues(0), ports.queues(1)));
    ports
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, DataplaneError> {
    std::thread::Builder::new().name(name.to_owned()).spawn(f).map_err(DataplaneError::Thread)
}
