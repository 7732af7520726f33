//! The threads of a running natrix and the handle that controls them.
//!
//! With one worker, one thread does everything for a frame: receive, ARP,
//! translate where the frame lies, next hop, transmit. With N workers there
//! are N threads, each owning one engine, and frames cross between them
//! over lock-free rings:
//! - where every interface has a receive queue per worker (AF_XDP on a
//!   multi-queue NIC), each worker serves its own queues of both
//!   interfaces, pinned to a CPU of its own: it translates the frames it
//!   owns where they lie, steers every other IP frame to the worker that
//!   owns its state, and sends what it translated from its own sockets;
//! - elsewhere the first worker owns both interfaces, steers every frame
//!   that is not its own to its owner and transmits what the workers hand back.
//!
//! The next-hop (ARP, NDP) state is shared, locked once per round and for
//! the rare frames that are not plain IP; steering's learned state, for
//! fragments and SCTP only.
//! Operators reach the threads through command channels that are checked
//! between batches.
//!
//! The parts: this file starts the threads and is the handle (`Dataplane`);
//! `links` holds both interfaces with the router state around them, `stage`
//! the frames of one round, `worker` the engines' threads, `io_thread` the
//! first worker, which also steers between workers, `commands` the
//! operators' requests, and `clock` time and idling.

mod clock;
mod commands;
mod cpus;
mod io_thread;
mod links;
mod offload;
mod stage;
mod worker;

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use natrix_engine::admin::{Cleared, MappingView, SessionView, Walk};
use natrix_engine::config::prefix_contains;
use natrix_engine::pipeline::hooks::FunctionRecord;
use natrix_engine::shard::{Owners, Shard};
use natrix_engine::{Engine, EngineConfig, Event, Side, Stats};
use natrix_io::af_packet::AfPacketPort;
use natrix_io::af_xdp::offload::{takes_redirects, Offload};
use natrix_io::af_xdp::{describe_tuning, DeviceTuning, XdpAttach, XdpMode, XdpPorts};
use natrix_io::ethtool::driver;
use natrix_io::iface::Interface;
use natrix_io::merging::describe as describe_merging;
use natrix_io::{check_frames_fit, CopyingPorts, FramePorts, IoError, PacketPort};

use crate::gateway::{Gateway, GatewayCounters, Link};
use crate::ring::{self, Consumer, Doorbell, Producer};
use crate::steer::Steering;
use clock::Clock;
use commands::{Command, Control, LinkReload};
pub use commands::{ControlError, Only, State, SyncTally};
use io_thread::{IoThread, Lanes};
use links::Links;
pub use offload::Returned as OffloadReturned;
use offload::{OffloadPlan, OffloadTable, Redirects};
use worker::{run_single, run_worker, EngineWorker};

/// Frames received from one interface per round.
const BATCH: usize = 64;
const RING_FRAMES: usize = 4096;
/// Per-queue workers have a ring from every worker to every other, each
/// `RING_FRAMES / workers` long but no shorter than this.
const MIN_RING_FRAMES: usize = 256;
/// Copy buffers of each ring between per-queue workers: they hand each
/// other held frames, and copy only frames the engine made and, while
/// buffers run short, received ones. Past these such frames are dropped
/// and counted: in a shortage, dropping at the handoff keeps the sender's
/// fill rings stocked, where handing frames held would tie up more of its
/// buffers. Slots cost 32 bytes, buffers 2 KiB.
const PER_QUEUE_COPIES: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoChoice {
    Auto,
    AfXdp,
    AfPacket,
}

/// Whether the AF_XDP devices defer their receive work to natrix's polls
/// while it runs (`prefer_busy_poll`). Deferred, a worker runs its
/// queues' receive work in its own polls while frames flow, and the
/// device's interrupt or NAPI thread no longer wakes for each batch: one
/// worker forwarded about half as much again for a third of the CPU per
/// frame (docs/BENCHMARKS.md, "A fair lab").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceDeferral {
    /// Where every worker polls queues of its own: one worker, or
    /// per-queue workers. Not where the first worker serves every queue
    /// for several, whose devices' NAPI threads then use the other
    /// workers' CPUs (undeferred, that arrangement forwarded more).
    Auto,
    On,
    Off,
}

impl DeviceDeferral {
    /// Why the devices defer, for `workers` workers served by `sets` sets
    /// of ports; None where they do not.
    fn wanted(self, workers: usize, sets: usize) -> Option<&'static str> {
        match self {
            DeviceDeferral::On => Some("prefer_busy_poll = true"),
            DeviceDeferral::Auto if workers <= 1 => Some("prefer_busy_poll = \"auto\", one worker"),
            DeviceDeferral::Auto if sets == workers => Some("prefer_busy_poll = \"auto\", per-queue workers"),
            DeviceDeferral::Auto | DeviceDeferral::Off => None,
        }
    }
}

/// Whether the interfaces' XDP programs forward established flows
/// themselves (`offload`), as the engine last translated them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offloading {
    /// Where natrix runs on AF_XDP and an interface's driver takes
    /// redirected frames.
    Auto,
    /// As `Auto`, and natrix does not start where it cannot.
    On,
    Off,
}

/// Flow directions the offload's table holds: up to about 26 MiB of kernel
/// memory, allocated as flows come (56-byte actions, 20-byte keys, the
/// kernel's element and bucket overhead).
const OFFLOAD_FLOWS: u32 = 131_072;

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
    /// AF_XDP: set the interfaces' `napi_defer_hard_irqs` and
    /// `gro_flush_timeout` (where nobody has) while natrix runs.
    pub prefer_busy_poll: DeviceDeferral,
    pub offload: Offloading,
    /// AF_XDP: where the interfaces' XDP programs run.
    pub xdp_mode: XdpAttach,
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
    /// Frames the worker took from the receive queues it serves: all of
    /// them with one worker, none for workers without interfaces.
    pub received: u64,
    /// Subscribers whose port use reached 50, 80, 90 and 100% of their limit.
    pub port_use_over: [u64; 4],
    pub pcp: natrix_engine::pcp::PcpStats,
    /// Flow directions of this worker in the offload's table, and those
    /// it had no room for.
    pub offloaded_flows: u64,
    pub offload_table_full: u64,
    /// Flow directions handed back from the offload to the worker, by
    /// `OffloadReturned::ALL`.
    pub offload_returned: [u64; OffloadReturned::ALL.len()],
    /// Frames whose transport checksum a sender's offload left partial,
    /// which the worker finished, by the side they arrived on.
    pub checksums_completed: [u64; 2],
}

/// The interfaces' state.
#[derive(Debug, Clone, Default)]
pub struct IoSnapshot {
    pub rx_frames: [u64; 2],
    pub rx_bytes: [u64; 2],
    pub tx_frames: [u64; 2],
    pub tx_bytes: [u64; 2],
    pub rx_refused: [u64; 2],
    /// Frames whose transport checksum a sender's offload left partial,
    /// which the port finished on receive (AF_PACKET; the workers finish
    /// AF_XDP's, `WorkerSnapshot::checksums_completed`).
    pub rx_checksums_completed: [u64; 2],
    pub rx_kernel_dropped: [u64; 2],
    pub tx_dropped: [u64; 2],
    pub handoff_dropped: u64,
    pub gateway: GatewayCounters,
    /// System calls of the threads that own the interfaces' queues: to
    /// make the kernel transmit, to make it receive, and to wait for
    /// frames (poll).
    pub transmit_calls: u64,
    pub receive_calls: u64,
    pub wait_calls: u64,
    /// Frames and bytes the XDP programs forwarded out of each interface
    /// themselves (`offload`; the flows in their table are the workers',
    /// `WorkerSnapshot`). The frames are in `rx_*` and `tx_*` too.
    pub offloaded_frames: [u64; 2],
    pub offloaded_bytes: [u64; 2],
    /// Whether each interface takes the frames the offload redirects to
    /// it, as last read (once a second); false without the offload.
    pub offload_egress: [bool; 2],
}

impl IoSnapshot {
    /// Partial checksums finished, by the interface the frames arrived
    /// on: by AF_PACKET's ports, which are told, and by the workers.
    pub fn checksums_completed(&self, workers: &[WorkerSnapshot]) -> [u64; 2] {
        [0, 1].map(|i| self.rx_checksums_completed[i] + workers.iter().map(|w| w.checksums_completed[i]).sum::<u64>())
    }

    /// Adds another worker's port counters; the gateway's are shared, so
    /// they are counted once. Every field is named, so that a new one is
    /// not forgotten here.
    fn add_ports(&mut self, other: &IoSnapshot) {
        let IoSnapshot {
            rx_frames,
            rx_bytes,
            tx_frames,
            tx_bytes,
            rx_refused,
            rx_checksums_completed,
            rx_kernel_dropped,
            tx_dropped,
            handoff_dropped,
            gateway: _,
            transmit_calls,
            receive_calls,
            wait_calls,
            offloaded_frames: _,
            offloaded_bytes: _,
            offload_egress: _,
        } = other;
        for side in 0..2 {
            self.rx_frames[side] += rx_frames[side];
            self.rx_bytes[side] += rx_bytes[side];
            self.tx_frames[side] += tx_frames[side];
            self.tx_bytes[side] += tx_bytes[side];
            self.rx_refused[side] += rx_refused[side];
            self.rx_checksums_completed[side] += rx_checksums_completed[side];
            self.rx_kernel_dropped[side] += rx_kernel_dropped[side];
            self.tx_dropped[side] += tx_dropped[side];
        }
        self.handoff_dropped += handoff_dropped;
        self.transmit_calls += transmit_calls;
        self.receive_calls += receive_calls;
        self.wait_calls += wait_calls;
    }
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
    /// How many workers, from the first, own interfaces' queues: one, or
    /// every worker when they are per-queue workers.
    io_workers: usize,
    backend: &'static str,
    notes: Vec<String>,
    events: std::sync::Mutex<Option<Receiver<Logged>>>,
    outside_prefix: (u32, u8),
    /// Put back once the threads have stopped (`stop`).
    tuning: Mutex<Option<DeviceTuning>>,
    offload: Option<OffloadPlan>,
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
        let (ports, [inside, outside], tuning, offload) = match options.ports {
            Some([inside, outside]) => {
                let ports: Box<dyn FramePorts> = Box::new(CopyingPorts::new([inside.port, outside.port]));
                (vec![ports], [LinkLayer { mac: inside.mac, mtu: inside.mtu }, LinkLayer { mac: outside.mac, mtu: outside.mtu }], None, None)
            }
            None => open_interfaces(&settings, &mut notes)?,
        };
        let backend = ports[0].backend();
        let mut engine_cfg = settings.engine.clone();
        engine_cfg.egress_mtu = [inside.mtu, outside.mtu];
        let gateway = Arc::new(Mutex::new(Gateway::new(
            Link {
                mac: inside.mac,
                addr: settings.inside.addr,
                prefix_len: settings.inside.prefix_len,
                answers_for: vec![settings.inside.addr],
                addr6: engine_cfg.inside_addr6,
                answers_for6: aftr_addresses(&engine_cfg),
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
        )));
        let offload = offload.map(|t| OffloadPlan::new(t, gateway.clone()));
        let mut links: Vec<Links> = ports.into_iter().map(|p| Links::new(p, gateway.clone())).collect();
        let (event_tx, event_rx) = mpsc::sync_channel(settings.event_buffer.max(1));
        let count = settings.workers.max(1);
        let mut engines = (0..count)
            .map(|index| Engine::new(EngineConfig { shard: Shard { index, count }, ..engine_cfg.clone() }))
            .collect::<Result<Vec<_>, _>>()
            .map_err(DataplaneError::Engine)?;
        let clock = Clock::new();
        // The engine's clock set first: the epoch the announcement carries
        // starts now, as every later answer's counts from it.
        engines[0].advance(clock.at(std::time::Instant::now()));
        if let Some(announce) = engines[0].pcp_announcement(inside.mac) {
            // RFC 6887 section 14.1.3: tell clients natrix (re)started, so they renew.
            links[0].stage.push_addressed(Side::Inside, &announce);
        }
        let mut dp = Dataplane {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Default::default(),
            workers: Vec::new(),
            io_workers: links.len(),
            backend,
            notes,
            events: std::sync::Mutex::new(Some(event_rx)),
            outside_prefix: (settings.outside.addr, settings.outside.prefix_len),
            tuning: Mutex::new(tuning),
            offload,
        };
        if links.len() > 1 {
            dp.start_per_queue(engines, links, &engine_cfg, event_tx, clock, settings.busy_poll)?;
        } else if count == 1 {
            dp.start_single(engines, links.remove(0), event_tx, clock, settings.busy_poll)?;
        } else {
            dp.start_sharded(engines, links.remove(0), &engine_cfg, event_tx, clock, settings.busy_poll)?;
        }
        if dp.offload.is_some() {
            // Every worker's offloader follows a moved next hop at once,
            // even one asleep because the program forwards all its flows.
            let bells = dp.workers.iter().map(|w| w.doorbell.clone()).collect();
            gateway.lock().unwrap_or_else(std::sync::PoisonError::into_inner).moves().wake(bells);
        }
        Ok(dp)
    }

    fn start_single(&mut self, mut engines: Vec<Engine>, mut links: Links, event_tx: SyncSender<Logged>, clock: Clock, busy_poll: bool) -> Result<(), DataplaneError> {
        let (commands, rx) = mpsc::channel();
        let doorbell = new_doorbell()?;
        let engine = engines.remove(0);
        let stop = self.stop.clone();
        let mut worker = EngineWorker::new(engine, rx, event_tx, self.offload.clone());
        let bell = doorbell.clone();
        let h = spawn("natrix-w0", move || {
            links.announce();
            run_single(&mut worker, &mut links, &bell, &stop, clock, busy_poll);
        })?;
        self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
        self.workers.push(Control::new(commands, doorbell));
        Ok(())
    }

    /// Worker 0 owns the interfaces and steers; workers 1.. take their
    /// frames from it over rings and hand them back.
    fn start_sharded(&mut self, engines: Vec<Engine>, links: Links, cfg: &EngineConfig, event_tx: SyncSender<Logged>, clock: Clock, busy_poll: bool) -> Result<(), DataplaneError> {
        let count = engines.len() as u16;
        let io_bell = new_doorbell()?;
        let mut lanes = Lanes { doorbells: vec![io_bell.clone()], ..Lanes::default() };
        let mut engines = engines.into_iter();
        let first = engines.next().expect("at least one engine");
        let frames = links.ports.shared();
        let (to_first, own_input) = ring::ring(RING_FRAMES, RING_FRAMES, frames.clone());
        lanes.to_workers.push(to_first);
        for (i, engine) in engines.enumerate() {
            let (to_worker, worker_in) = ring::ring(RING_FRAMES, RING_FRAMES, frames.clone());
            let (worker_out, from_worker) = ring::ring(RING_FRAMES, RING_FRAMES, frames.clone());
            let (commands, rx) = mpsc::channel();
            let bell = new_doorbell()?;
            let mut worker = EngineWorker::new(engine, rx, event_tx.clone(), self.offload.clone());
            let (stop, wbell, io_bell) = (self.stop.clone(), bell.clone(), io_bell.clone());
            let h = spawn(&format!("natrix-w{}", i + 1), move || run_worker(&mut worker, worker_in, worker_out, &wbell, &io_bell, &stop, clock, busy_poll))?;
            self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
            self.workers.push(Control::new(commands, bell.clone()));
            lanes.to_workers.push(to_worker);
            lanes.from_workers.push(from_worker);
            lanes.doorbells.push(bell);
        }
        let (commands, rx) = mpsc::channel();
        self.workers.insert(0, Control::new(commands, io_bell.clone()));
        let (steering, pool) = steering_for(cfg, count);
        let stop = self.stop.clone();
        let worker = EngineWorker::new(first, rx, event_tx, self.offload.clone());
        let h = spawn("natrix-w0", move || {
            let mut io = IoThread { index: 0, worker, links, lanes, inputs: vec![own_input], steering, pool, handoffs: Vec::with_capacity(BATCH) };
            io.links.announce();
            io.run(&io_bell, &stop, clock, busy_poll);
        })?;
        self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
        Ok(())
    }

    /// Every worker serves its own queues (`links[w]`) and has a ring to
    /// every worker, itself included, for the frames it steers there.
    fn start_per_queue(
        &mut self,
        engines: Vec<Engine>,
        links: Vec<Links>,
        cfg: &EngineConfig,
        event_tx: SyncSender<Logged>,
        clock: Clock,
        busy_poll: bool,
    ) -> Result<(), DataplaneError> {
        let count = engines.len();
        let frames = links[0].ports.shared();
        let capacity = (RING_FRAMES / count).max(MIN_RING_FRAMES);
        let mut to_workers: Vec<Vec<Producer>> = (0..count).map(|_| Vec::with_capacity(count)).collect();
        let mut inputs: Vec<Vec<Consumer>> = (0..count).map(|_| Vec::with_capacity(count)).collect();
        for outputs in &mut to_workers {
            for input in &mut inputs {
                let (to, from) = ring::ring(capacity, PER_QUEUE_COPIES, frames.clone());
                outputs.push(to);
                input.push(from);
            }
        }
        let doorbells = (0..count).map(|_| new_doorbell()).collect::<Result<Vec<_>, _>>()?;
        let (steering, pool) = steering_for(cfg, count as u16);
        let cpus = cpus::one_each(count);
        let threads = engines.into_iter().zip(links).zip(to_workers.into_iter().zip(inputs));
        let mut unpinned = 0;
        for (index, ((engine, links), (to_workers, inputs))) in threads.enumerate() {
            let (commands, rx) = mpsc::channel();
            let worker = EngineWorker::new(engine, rx, event_tx.clone(), self.offload.clone());
            let lanes = Lanes { to_workers, from_workers: Vec::new(), doorbells: doorbells.clone() };
            let mut io = IoThread { index, worker, links, lanes, inputs, steering: steering.clone(), pool: pool.clone(), handoffs: Vec::with_capacity(BATCH) };
            let (stop, bell) = (self.stop.clone(), doorbells[index].clone());
            let h = spawn(&format!("natrix-w{index}"), move || {
                if index == 0 {
                    io.links.announce();
                }
                io.run(&bell, &stop, clock, busy_poll);
            })?;
            if let Some(cpu) = cpus.as_ref().map(|c| c[index]) {
                if let Err(e) = cpus::pin(&h, cpu) {
                    self.notes.push(format!("worker {index} could not be pinned to CPU {cpu}: {e}"));
                    unpinned += 1;
                }
            }
            self.threads.get_mut().map_err(|_| DataplaneError::Poisoned)?.push(h);
            self.workers.push(Control::new(commands, doorbells[index].clone()));
        }
        self.notes.push(match cpus {
            Some(cpus) if unpinned == 0 => format!("{count} per-queue workers, pinned to CPUs {cpus:?}"),
            Some(cpus) => format!("{count} per-queue workers, pinned to CPUs {cpus:?} but for {unpinned} (above)"),
            None => format!("{count} per-queue workers, not pinned: natrix may use fewer CPUs than that"),
        });
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

    /// The interfaces' counters, summed over the workers that serve them,
    /// with the frames the XDP programs forwarded themselves.
    pub fn io_snapshot(&self) -> Result<IoSnapshot, ControlError> {
        let mut total = self.workers[0].ask(Command::Io)?;
        for w in &self.workers[1..self.io_workers] {
            total.add_ports(&w.ask(Command::Io)?);
        }
        if let Some(plan) = &self.offload {
            for (out, (frames, bytes)) in plan.forwarded().into_iter().enumerate() {
                total.offloaded_frames[out] = frames;
                total.offloaded_bytes[out] = bytes;
                total.tx_frames[out] += frames;
                total.tx_bytes[out] += bytes;
                total.rx_frames[1 - out] += frames;
                total.rx_bytes[1 - out] += bytes;
            }
            total.offload_egress = plan.redirects_taken();
        }
        Ok(total)
    }

    /// The sessions `only` asks for: a subscriber's (None: everyone's), a
    /// B4's, at most `limit`. Each worker walks its table a part at a time
    /// between batches.
    pub fn sessions(&self, only: Only, limit: usize) -> Result<Vec<SessionView>, ControlError> {
        self.listing(only, limit, |tx, limit| Command::Sessions(Walk::new(only.subscriber, limit).behind(only.b4), tx))
    }

    pub fn mappings(&self, only: Only, limit: usize) -> Result<Vec<MappingView>, ControlError> {
        self.listing(only, limit, |tx, limit| Command::Mappings(Walk::new(only.subscriber, limit).behind(only.b4), tx))
    }

    /// Every worker's rows of a listing, the first `limit` of them (worker
    /// 0's first), within one deadline for all. A filtered listing walks
    /// every worker's whole table for few rows: the workers walk at once.
    /// An unfiltered one stops at its limit: the workers are asked one
    /// after another for what is still missing, so no more rows than the
    /// limit are ever made.
    fn listing<T>(&self, only: Only, limit: usize, ask: impl Fn(std::sync::mpsc::Sender<Vec<T>>, usize) -> Command) -> Result<Vec<T>, ControlError> {
        let deadline = std::time::Instant::now() + commands::COMMAND_TIMEOUT;
        let wait =
            |answer: std::sync::mpsc::Receiver<Vec<T>>| answer.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).map_err(|_| ControlError::NoAnswer);
        let mut rows = Vec::new();
        if only == Only::default() {
            for w in &self.workers {
                let missing = limit - rows.len();
                if missing == 0 {
                    break;
                }
                rows.extend(wait(w.post(|tx| ask(tx, missing))?)?);
            }
            return Ok(rows);
        }
        let answers = self.workers.iter().map(|w| w.post(|tx| ask(tx, limit))).collect::<Result<Vec<_>, _>>()?;
        for answer in answers {
            rows.extend(wait(answer)?);
        }
        rows.truncate(limit);
        Ok(rows)
    }

    /// Asks every worker for its whole tables (every mapping, every
    /// session) without waiting: a cluster node's resync, collected with
    /// `State::try_take` while the node goes on with its heartbeats.
    pub fn post_state(&self) -> Result<State, ControlError> {
        let mut mappings = Vec::new();
        let mut sessions = Vec::new();
        for w in &self.workers {
            mappings.push(w.post(|tx| Command::Mappings(Walk::new(None, usize::MAX), tx))?);
            sessions.push(w.post(|tx| Command::Sessions(Walk::new(None, usize::MAX), tx))?);
        }
        let deadline = std::time::Instant::now() + commands::COMMAND_TIMEOUT;
        Ok(State { mappings, sessions, got: (Vec::new(), Vec::new()), deadline })
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
    /// first refusal is returned and nothing changes. A worker that does
    /// not answer leaves them on different configurations, which the
    /// error says.
    pub fn reload(&self, cfg: &EngineConfig) -> Result<(), ControlError> {
        for (i, w) in self.workers.iter().enumerate() {
            match w.ask(|tx| Command::Reload(Box::new(cfg.clone()), tx)) {
                Ok(answer) => answer.map_err(ControlError::Refused)?,
                Err(ControlError::NoAnswer) => return Err(ControlError::PartlyApplied { applied: i, of: self.workers.len() }),
                Err(e) => return Err(e),
            }
        }
        let outside = LinkSettings { interface: String::new(), addr: self.outside_prefix.0, prefix_len: self.outside_prefix.1 };
        let reload = LinkReload { answers: outside_answers(&outside, &cfg.pool), answers6: aftr_addresses(cfg), pool: sorted(&cfg.pool) };
        self.workers[..self.io_workers].iter().try_for_each(|w| w.ask(|tx| Command::ReloadLinks(reload.clone(), tx)))
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

    /// Stops every thread and waits for them, then puts back the devices'
    /// settings natrix changed; later calls do nothing.
    pub fn stop(&self) {
        // Events nobody took (no logger) must not hold up the workers'
        // last deletions, which wait for room in the channel.
        drop(self.take_events());
        self.stop.store(true, Ordering::SeqCst);
        for w in &self.workers {
            w.doorbell.ring_always();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for h in threads {
            let _ = h.join();
        }
        drop(self.tuning.lock().unwrap_or_else(|p| p.into_inner()).take());
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

/// The addresses natrix answers Neighbor Solicitations for on the inside
/// besides its own: the DS-Lite AFTR's, where B4s are on the link.
fn aftr_addresses(cfg: &EngineConfig) -> Vec<std::net::Ipv6Addr> {
    cfg.dslite.iter().map(|d| d.aftr).collect()
}

/// Steering for `workers` workers, and the pool sorted to recognise
/// hairpins between them.
fn steering_for(cfg: &EngineConfig, workers: u16) -> (Steering, Vec<u32>) {
    (Steering::new(Owners::for_config(cfg, workers), cfg.translate).with_sctp(&cfg.sctp), sorted(&cfg.pool))
}

fn sorted(pool: &[u32]) -> Vec<u32> {
    let mut pool = pool.to_vec();
    pool.sort_unstable();
    pool
}

/// The interfaces' ports: one set, or one per per-queue worker.
type PortSets = Vec<Box<dyn FramePorts>>;

/// What natrix reads from an interface besides its frames.
struct LinkLayer {
    mac: [u8; 6],
    /// For the engine's egress checks (0: no limit).
    mtu: u16,
}

/// What `open_interfaces` gives: the ports, what natrix reads from each
/// interface, the devices' tuning to put back, the offload.
type Opened = (PortSets, [LinkLayer; 2], Option<DeviceTuning>, Option<OffloadTable>);

/// Opens both interfaces with the backend `settings` asks for; both are
/// looked up before either is opened. Per-queue workers get a set of
/// ports each; otherwise there is one set. AF_XDP interfaces are tuned
/// for busy polling, and given the offload, where `settings` asks.
fn open_interfaces(settings: &Settings, notes: &mut Vec<String>) -> Result<Opened, DataplaneError> {
    let inside = Interface::lookup(&settings.inside.interface)?;
    let outside = Interface::lookup(&settings.outside.interface)?;
    for iface in [&inside, &outside] {
        check_frames_fit(&iface.name, iface.mtu)?;
    }
    let mut offload = offload_table(settings, [&inside, &outside], notes)?;
    let (ports, generic) = open_ports(&inside, &outside, settings, &mut offload, notes)?;
    if ports[0].backend() != "af_xdp" && offload.take().is_some() {
        if settings.offload == Offloading::On {
            return Err(refuse_offload(&inside, "offload = true needs AF_XDP, and natrix fell back to AF_PACKET (above)".to_owned()));
        }
        notes.push("offload: off, as natrix runs on AF_PACKET".to_owned());
    }
    if settings.io == IoChoice::AfPacket && settings.xdp_mode != XdpAttach::Auto {
        notes.push(format!("xdp_mode applies to AF_XDP only: with {} it is not used", ports[0].backend()));
    }
    let offload = offload.map(|(table, described)| {
        notes.extend(described);
        table
    });
    let tuning = match (settings.prefer_busy_poll.wanted(usize::from(settings.workers), ports.len()), ports[0].backend()) {
        // A generic program's frames reach the sockets from the stack, whose
        // receive work natrix's polls cannot run: deferred, it would wait
        // for the devices' timers.
        (Some(_), "af_xdp") if generic && settings.prefer_busy_poll == DeviceDeferral::Auto => {
            notes.push("prefer_busy_poll = \"auto\": the devices are left as they are, as natrix's polls cannot run their receive work for generic XDP programs".to_owned());
            None
        }
        (Some(why), "af_xdp") => Some(tune_for_busy_polling([&inside, &outside], why, notes)),
        (Some(_), backend) if settings.prefer_busy_poll == DeviceDeferral::On => {
            notes.push(format!("prefer_busy_poll applies to AF_XDP only: with {backend} the devices are left as they are"));
            None
        }
        // "auto" with AF_PACKET: nothing was asked of it.
        _ => None,
    };
    Ok((ports, [LinkLayer { mac: inside.mac, mtu: inside.mtu }, LinkLayer { mac: outside.mac, mtu: outside.mtu }], tuning, offload))
}

/// The offload `settings` asks for, where the interfaces allow it: its
/// table, which interfaces take the frames the programs redirect, and the
/// start-up notes that say so, for once the ports are open.
fn offload_table(settings: &Settings, interfaces: [&Interface; 2], notes: &mut Vec<String>) -> Result<Option<(OffloadTable, Vec<String>)>, DataplaneError> {
    if settings.offload == Offloading::Off || settings.io == IoChoice::AfPacket {
        if settings.offload == Offloading::On {
            return Err(refuse_offload(interfaces[0], "offload = true needs AF_XDP (io = \"af_packet\")".to_owned()));
        }
        return Ok(None);
    }
    let read: fn(u32) -> std::io::Result<bool> = match settings.xdp_mode {
        // The kernel sends what a generic program redirects as any frame.
        XdpAttach::Generic => |_| Ok(true),
        // Where "auto" falls back to generic mode this is stricter than
        // it need be, never looser.
        XdpAttach::Auto | XdpAttach::Native => takes_redirects,
    };
    let takes = interfaces.map(|i| read(i.index).map_err(|e| e.to_string()));
    let egress_ok = [takes[0] == Ok(true), takes[1] == Ok(true)];
    if egress_ok == [false, false] {
        let why: Vec<String> = interfaces.iter().zip(&takes).map(|(i, t)| format!("{}: {}", i.name, redirect_refusal(t))).collect();
        if settings.offload == Offloading::On {
            return Err(refuse_offload(interfaces[0], format!("offload = true, but neither interface takes redirected frames ({})", why.join("; "))));
        }
        notes.push(format!("offload: off, as neither interface takes frames redirected from XDP ({})", why.join("; ")));
        return Ok(None);
    }
    let table = match Offload::new(OFFLOAD_FLOWS) {
        Ok(t) => Arc::new(t),
        Err(e) if settings.offload == Offloading::On => return Err(refuse_offload(interfaces[0], format!("offload = true, but its flow table could not be made: {e}"))),
        Err(e) => {
            notes.push(format!("offload: off, as its flow table could not be made: {e}"));
            return Ok(None);
        }
    };
    let described = interfaces
        .iter()
        .zip(&takes)
        .enumerate()
        .map(|(i, (iface, t))| match egress_ok[i] {
            true => format!("offload: established flows from {} to {} are forwarded by XDP, up to {OFFLOAD_FLOWS} flow directions", interfaces[1 - i].name, iface.name),
            false => format!("offload: flows to {} stay with the workers ({})", iface.name, redirect_refusal(t)),
        })
        .collect();
    let ifindex = interfaces.map(|i| i.index);
    let redirects = Arc::new(Redirects::new(ifindex, egress_ok, read));
    Ok(Some((OffloadTable { map: table, ifindex, redirects, mtu: interfaces.map(|i| i.mtu) }, described)))
}

fn refuse_offload(interface: &Interface, reason: String) -> DataplaneError {
    DataplaneError::Io(IoError::Unsupported { interface: interface.name.clone(), reason })
}

/// Why an interface takes no redirected frames, for the notes.
fn redirect_refusal(takes: &Result<bool, String>) -> String {
    match takes {
        Ok(true) => "it takes them".to_owned(),
        Ok(false) => "its driver takes no redirected frames; a veth takes them while its peer has GRO on (`ethtool -K PEER gro on`) or an XDP program".to_owned(),
        Err(e) => format!("its XDP features could not be read: {e}"),
    }
}

/// Defers the interfaces' receive work to natrix's polls, noting what
/// became of each and `why`.
fn tune_for_busy_polling(interfaces: [&Interface; 2], why: &str, notes: &mut Vec<String>) -> DeviceTuning {
    let (tuning, outcomes) = DeviceTuning::apply(&interfaces.map(|i| (i.name.as_str(), i.index)));
    notes.extend(interfaces.iter().zip(&outcomes).map(|(i, tuned)| describe_tuning(&i.name, tuned, why)));
    tuning
}

/// Opens the ports `settings` asks for; with `offload`'s table, where it
/// can, the programs' fast path taking it up (where it cannot and the
/// offload is only "auto", without, and `offload` left empty). Says
/// whether an XDP program runs in generic mode.
fn open_ports<T>(
    inside: &Interface,
    outside: &Interface,
    settings: &Settings,
    offload: &mut Option<(OffloadTable, T)>,
    notes: &mut Vec<String>,
) -> Result<(PortSets, bool), DataplaneError> {
    let af_packet = |notes: &mut Vec<String>| -> Result<(PortSets, bool), DataplaneError> {
        let (a, b) = (AfPacketPort::open(inside)?, AfPacketPort::open(outside)?);
        for (port, iface) in [&a, &b].iter().zip([inside, outside]) {
            notes.extend(describe_merging(&iface.name, port.receive_merging()));
            if is_veth(&iface.name) {
                notes.push(veth_segments_note(&iface.name, "AF_PACKET gets", "io = \"af_xdp\" with native XDP programs"));
            }
        }
        let ports: [Box<dyn PacketPort>; 2] = [Box::new(a), Box::new(b)];
        Ok((vec![Box::new(CopyingPorts::new(ports))], false))
    };
    let mut af_xdp = || {
        let open = |table: Option<&Offload>| XdpPorts::open_per_queue(&[&inside.name, &outside.name], usize::from(settings.workers.max(1)), table, settings.xdp_mode);
        match open(offload.as_ref().map(|(t, _)| &*t.map)) {
            // Without the fast path it opens: the fast path was the trouble.
            Err(e) if offload.is_some() && settings.offload == Offloading::Auto => match open(None) {
                Ok(opened) => {
                    notes.push(format!("offload: off, as the XDP program could not take its fast path ({e})"));
                    *offload = None;
                    Ok(opened)
                }
                Err(_) => Err(e),
            },
            opened => opened,
        }
    };
    match settings.io {
        IoChoice::AfPacket => af_packet(notes),
        IoChoice::AfXdp => {
            let sets = af_xdp()?;
            Ok(described(sets, [inside, outside], settings.workers, notes))
        }
        IoChoice::Auto => match af_xdp() {
            Ok(p) => Ok(described(p, [inside, outside], settings.workers, notes)),
            Err(e) if settings.offload == Offloading::On => Err(refuse_offload(inside, format!("offload = true needs AF_XDP, which is unavailable: {e}"))),
            Err(e) => {
                notes.push(format!("AF_XDP unavailable ({e}); using AF_PACKET on {} and {}", inside.name, outside.name));
                af_packet(notes)
            }
        },
    }
}

/// Notes how the AF_XDP sockets were bound, where the programs run and,
/// for per-queue workers, which queues each serves, for the start-up
/// report; says whether a program runs in generic mode.
fn described(sets: Vec<XdpPorts>, interfaces: [&Interface; 2], workers: u16, notes: &mut Vec<String>) -> (PortSets, bool) {
    let programs = sets[0].program_modes();
    let generic = programs.contains(&XdpAttach::Generic);
    let mode = match sets[0].mode() {
        XdpMode::Copy if generic => "copy mode (generic XDP programs)",
        XdpMode::Copy => "copy mode (the drivers have no zero-copy)",
        XdpMode::ZeroCopy => "zero-copy",
    };
    let queues = |side| sets.iter().map(|s| s.queues(side)).sum::<usize>();
    notes.push(format!("AF_XDP in {mode}: one UMEM for {} inside and {} outside receive queues, frames forwarded where they lie", queues(0), queues(1)));
    notes.push(program_modes(&programs, interfaces));
    if generic {
        for (side, iface) in interfaces.iter().enumerate().filter(|(_, i)| is_veth(&i.name)) {
            notes.push(veth_segments_note(&iface.name, "generic XDP programs see", "xdp_mode = \"native\""));
            if sets.len() > 1 {
                notes.push(veth_queues_note(&iface.name, queues(side)));
            }
        }
    }
    if sets.len() > 1 {
        for (w, set) in sets.iter().enumerate() {
            let [inside, outside] = [0, 1].map(|side| set.served_queues(side));
            notes.push(format!("worker {w} serves receive queues {inside:?} of {} and {outside:?} of {}", interfaces[0].name, interfaces[1].name));
        }
    } else if workers > 1 {
        notes.push(format!(
            "{} has {} receive queues and {} has {}: per-queue workers need {workers} on each, so worker 0 serves every queue and hands the other workers their frames",
            interfaces[0].name,
            queues(0),
            interfaces[1].name,
            queues(1)
        ));
    }
    (sets.into_iter().map(|s| Box::new(s) as Box<dyn FramePorts>).collect(), generic)
}

/// A veth peer with segmentation offload (TSO, GSO: a veth's default)
/// sends segments of up to 64 KiB whole; a native program on the veth
/// makes the kernel cut them for the peer first, while a generic one and
/// AF_PACKET (`reader`) get them whole, too long for natrix's buffers.
fn veth_segments_note(interface: &str, reader: &str, instead: &str) -> String {
    format!(
        "{interface} is a veth: {reader} its peer's TCP segments unsegmented where the peer has segmentation offload on, too long for natrix's buffers, and natrix refuses them (rx_refused_total); `ethtool -K PEER tso off gso off` on the peer, or {instead}, avoids it"
    )
}

/// Whether `interface`'s driver is veth's.
fn is_veth(interface: &str) -> bool {
    driver(interface).as_deref() == Some("veth")
}

/// veth records no receive queue for the frames it hands its stack, and
/// the kernel then reads the sender's transmit queue, less one, as the
/// receive queue a generic program sees: the sender's first two queues
/// land on queue 0, and the last of `queues` gets nothing.
fn veth_queues_note(interface: &str, queues: usize) -> String {
    format!(
        "{interface} is a veth: with generic XDP programs a frame its peer sent on transmit queue q reaches receive queue q - 1 (queues 0 and 1 both reach 0), so queue {} receives none and queue 0 twice its share; the workers hand each other their frames, and xdp_mode = \"native\" spreads them evenly",
        queues.saturating_sub(1)
    )
}

/// Where the XDP programs run (`modes`, one per interface), for the
/// start-up report.
fn program_modes(modes: &[XdpAttach], interfaces: [&Interface; 2]) -> String {
    if modes.iter().all(|m| *m == modes[0]) {
        return format!("XDP programs in {} mode on {} and {}", modes[0].name(), interfaces[0].name, interfaces[1].name);
    }
    let each: Vec<String> = modes.iter().zip(interfaces).map(|(m, i)| format!("{} mode on {}", m.name(), i.name)).collect();
    format!("XDP programs in {}", each.join(" and "))
}

fn new_doorbell() -> Result<Arc<Doorbell>, DataplaneError> {
    Doorbell::new().map(Arc::new).map_err(DataplaneError::Thread)
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, DataplaneError> {
    std::thread::Builder::new().name(name.to_owned()).spawn(f).map_err(DataplaneError::Thread)
}

#[cfg(test)]
mod tests {
    use super::DeviceDeferral;

    #[test]
    fn devices_defer_as_told() {
        // "auto": one worker, or per-queue workers (a set of ports each).
        assert!(DeviceDeferral::Auto.wanted(1, 1).is_some());
        assert!(DeviceDeferral::Auto.wanted(4, 4).is_some());
        // Two workers on one set: the first serves every queue.
        assert_eq!(DeviceDeferral::Auto.wanted(2, 1), None);
        assert!(DeviceDeferral::On.wanted(2, 1).is_some());
        assert_eq!(DeviceDeferral::Off.wanted(1, 1), None);
        assert_eq!(DeviceDeferral::Off.wanted(4, 4), None);
    }
}
