//! The engines' threads: a worker owns one engine; with one worker it also
//! owns the interfaces (`run_single`), with several it takes frames from
//! the first worker's ring and hands them back (`run_worker`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError};
use std::time::Instant;

use natrix_engine::admin::{Cleared, MappingView, SessionView, Walk};
use natrix_engine::{Engine, FrameBuf, Side, Verdict};
use natrix_io::FrameId;
use natrix_wire::partial_checksum::{self, Found};

use super::clock::{sleep_ms, Clock, Idle, Work};
use super::commands::{Command, COMMAND_TIMEOUT};
use super::links::Links;
use super::offload::{OffloadPlan, Offloader, Returned as OffloadReturned};
use super::{Logged, WorkerSnapshot, PORT_USE_THRESHOLDS};
use crate::ring::{wait_readable, Consumer, Doorbell, Producer, MAX_POP};

/// A worker's engine and its links to the control plane.
pub(super) struct EngineWorker {
    engine: Engine,
    pub(super) commands: Receiver<Command>,
    events: SyncSender<Logged>,
    events_lost: u64,
    /// CPU time spent in rounds that carried frames.
    pub(super) work: Work,
    pub(super) handoff_dropped: u64,
    /// Frames this worker received from the interfaces' queues it serves.
    pub(super) received: u64,
    /// Where the interfaces' XDP programs forward established flows.
    offload: Option<Offloader>,
    /// Partial checksums finished, by the side the frames arrived on.
    checksums_completed: [u64; 2],
    /// Which frames of the batch in hand looked left partial.
    looked_partial: Vec<bool>,
    /// Listings asked for (`natrix show`, a cluster's resync), made a part
    /// per round, the first first.
    listings: VecDeque<Listing>,
}

/// Mapping records and sessions a listing looks at per round (a mapping's
/// sessions all at once): about 0.1 ms of a worker's time, so the rings
/// it serves wait no longer than for a batch.
const LISTING_STEP: u32 = 4096;

/// A listing being made, where it goes when done, and until when its
/// asker waits (`COMMAND_TIMEOUT`): one it gave up on is dropped, so the
/// listings behind it are not held up.
enum Listing {
    Sessions(Walk<SessionView>, Sender<Vec<SessionView>>, Instant),
    Mappings(Walk<MappingView>, Sender<Vec<MappingView>>, Instant),
    /// A clear: the subscriber's mappings found a part at a time, then
    /// their sessions ended at once.
    Clear(Walk<u32>, u32, Sender<Cleared>, Instant),
}

impl Listing {
    fn expired(&self, now: Instant) -> bool {
        match self {
            Listing::Sessions(_, _, until) | Listing::Mappings(_, _, until) | Listing::Clear(_, _, _, until) => now > *until,
        }
    }
}

impl EngineWorker {
    pub(super) fn new(engine: Engine, commands: Receiver<Command>, events: SyncSender<Logged>, offload: Option<OffloadPlan>) -> EngineWorker {
        let offload = offload.map(Offloader::new);
        EngineWorker {
            engine,
            commands,
            events,
            events_lost: 0,
            work: Work::default(),
            handoff_dropped: 0,
            received: 0,
            offload,
            checksums_completed: [0; 2],
            looked_partial: Vec::new(),
            listings: VecDeque::new(),
        }
    }

    /// Makes a part of the first listing asked for, and sends it once done;
    /// returns whether one is still being made (the thread then does not sleep).
    pub(super) fn make_listings(&mut self) -> bool {
        if self.listings.is_empty() {
            return false;
        }
        let now = Instant::now();
        self.listings.retain(|l| !l.expired(now));
        let done = match self.listings.front_mut() {
            None => return false,
            Some(Listing::Sessions(w, _, _)) => self.engine.walk_sessions(w, LISTING_STEP),
            Some(Listing::Mappings(w, _, _)) => self.engine.walk_mappings(w, LISTING_STEP),
            Some(Listing::Clear(w, _, _, _)) => self.engine.walk_subscriber_mappings(w, LISTING_STEP),
        };
        if done {
            match self.listings.pop_front() {
                Some(Listing::Sessions(w, tx, _)) => drop(tx.send(w.rows)),
                Some(Listing::Mappings(w, tx, _)) => drop(tx.send(w.rows)),
                Some(Listing::Clear(w, addr, tx, _)) => {
                    self.forget_offloaded();
                    let (events, lost) = (&self.events, &mut self.events_lost);
                    let _ = tx.send(self.engine.clear_mappings(addr, &w.rows, |e| offer(events, lost, Logged::Nat(e))));
                }
                None => {}
            }
        }
        !self.listings.is_empty()
    }

    /// Translates a batch of frames, `sides[i]` the side `frames[i]` arrived
    /// on, through the engine's batch path (prefetch across the batch), a
    /// run of frames from one side at a time so their order holds;
    /// `verdicts[i]` says what became of `frames[i]`.
    pub(super) fn translate_batch<F: FrameBuf>(&mut self, sides: &[Side], frames: &mut [F], now: u64, verdicts: &mut [Verdict]) {
        self.finish_partial_checksums(sides, frames);
        if let Some(offload) = self.offload.as_mut() {
            offload.before_batch(frames, &self.looked_partial);
        }
        self.translate_runs(sides, frames, now, verdicts);
        if let Some(offload) = self.offload.as_mut() {
            offload.after_batch(&self.engine, sides, frames, verdicts, now);
        }
    }

    /// Finishes the transport checksums a sender's offload left partial (a
    /// veth peer's): the engine updates checksums, it does not compute
    /// them. AF_XDP does not mark such frames; AF_PACKET's port has
    /// finished the ones it marks, which then look whole and are left
    /// alone. Notes which frames looked partial, for the offload.
    fn finish_partial_checksums<F: FrameBuf>(&mut self, sides: &[Side], frames: &mut [F]) {
        self.looked_partial.clear();
        for (f, &side) in frames.iter_mut().zip(sides) {
            let found = partial_checksum::complete_if_partial(f.frame());
            self.checksums_completed[side as usize] += u64::from(found == Found::Finished);
            self.looked_partial.push(found.looks_partial());
        }
    }

    fn translate_runs<F: FrameBuf>(&mut self, sides: &[Side], frames: &mut [F], now: u64, verdicts: &mut [Verdict]) {
        let mut start = 0;
        while start < frames.len() {
            let side = sides[start];
            let end = start + sides[start..].iter().take_while(|&&s| s == side).count();
            self.engine.process_batch(&mut frames[start..end], side, now, &mut verdicts[start..end]);
            start = end;
        }
    }

    /// Takes one batch from `input`, translates it, and hands `each` every
    /// frame with its verdict and, for a held frame, its id; returns how
    /// many frames it took.
    pub(super) fn translate_popped(&mut self, input: &mut Consumer, now: u64, mut each: impl FnMut(&[u8], Verdict, Option<FrameId>)) -> usize {
        input.pop_batch(|sides, frames, held| {
            self.work.begin();
            let mut verdicts = [Verdict::Held; MAX_POP];
            let verdicts = &mut verdicts[..frames.len()];
            self.translate_batch(sides, frames, now, verdicts);
            for ((frame, &v), &id) in frames.iter().zip(verdicts.iter()).zip(held) {
                each(frame, v, id);
            }
        })
    }

    /// When the engine's next timer falls due (`Engine::next_wake_ns`).
    pub(super) fn next_wake_ns(&self) -> u64 {
        self.engine.next_wake_ns()
    }

    /// Work done between batches: timers, generated frames, events.
    pub(super) fn housekeeping(&mut self, now: u64, out: &mut impl FnMut(Side, &[u8])) {
        self.engine.advance(now);
        if let Some(offload) = self.offload.as_mut() {
            offload.sweep(&mut self.engine, now);
        }
        self.engine.drain_output(|o| out(o.side, &o.data));
        let (events, lost) = (&self.events, &mut self.events_lost);
        self.engine.drain_events(|e| offer(events, lost, Logged::Nat(e)));
        self.engine.drain_function_records(|r| offer(events, lost, Logged::Function(r)));
    }

    pub(super) fn command(&mut self, cmd: Command, io: Option<&mut Links>) {
        match cmd {
            Command::Worker(tx) => {
                let _ = tx.send(self.snapshot());
            }
            Command::Sessions(walk, tx) => self.listings.push_back(Listing::Sessions(walk, tx, Instant::now() + COMMAND_TIMEOUT)),
            Command::Mappings(walk, tx) => self.listings.push_back(Listing::Mappings(walk, tx, Instant::now() + COMMAND_TIMEOUT)),
            Command::Clear(addr, tx) => self.listings.push_back(Listing::Clear(Walk::new(Some(addr), usize::MAX), addr, tx, Instant::now() + COMMAND_TIMEOUT)),
            Command::Reload(cfg, tx) => {
                let mut cfg = *cfg;
                cfg.egress_mtu = self.engine.config().egress_mtu;
                self.forget_offloaded();
                let (events, lost) = (&self.events, &mut self.events_lost);
                let _ = tx.send(self.engine.reconfigure(cfg, |e| offer(events, lost, Logged::Nat(e))));
            }
            Command::InstallSynced(events, tx) => {
                let mut tally = super::SyncTally::default();
                for e in &events {
                    match self.engine.install_synced(e) {
                        Ok(()) => tally.installed += 1,
                        Err(_) => tally.refused += 1,
                    }
                }
                let _ = tx.send(tally);
            }
            Command::SetStandby(standby, tx) => {
                self.forget_offloaded();
                self.engine.set_standby(standby);
                let _ = tx.send(());
            }
            Command::Io(tx) => {
                let _ = tx.send(io.map(|p| p.snapshot()).unwrap_or_default());
            }
            Command::ReloadLinks(reload, tx) => {
                if let Some(p) = io {
                    let mut gateway = p.gateway();
                    gateway.set_answers_for(Side::Outside, reload.answers);
                    gateway.set_answers_for6(Side::Inside, reload.answers6);
                }
                let _ = tx.send(());
            }
        }
    }

    /// Hands every offloaded flow back to the engine, before a change to
    /// its sessions or rules that would make the program's rewrites stale.
    fn forget_offloaded(&mut self) {
        if let Some(offload) = self.offload.as_mut() {
            offload.forget_all();
        }
    }

    /// At a clean stop: end every mapping and hand the logger every deletion,
    /// waiting for room this once (the packet path has stopped): each is a
    /// record `whois` needs.
    pub(super) fn finish(&mut self) {
        let events = &self.events;
        self.engine.release_all(|e| {
            let _ = events.send(Logged::Nat(e));
        });
        self.engine.drain_function_records(|r| {
            let _ = events.send(Logged::Function(r));
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
            sessions_by_proto: e.sessions_by_proto(),
            mappings_by_proto: e.mappings_by_proto(),
            subscribers: e.subscribers().len() as u64,
            ports_in_use: e.pool().ports_in_use(),
            total_ports: e.pool().total_ports(),
            memory_bytes: e.memory_bytes() as u64,
            events_lost: self.events_lost + e.events_lost(),
            busy_ns: self.work.ns,
            handoff_dropped: self.handoff_dropped,
            received: self.received,
            port_use_over: over,
            pcp: e.pcp_stats(),
            offloaded_flows: self.offload.as_ref().map_or(0, |o| o.counts().0),
            offload_table_full: self.offload.as_ref().map_or(0, |o| o.counts().1),
            offload_returned: self.offload.as_ref().map_or([0; OffloadReturned::ALL.len()], |o| o.returned()),
            checksums_completed: self.checksums_completed,
        }
    }
}

pub(super) fn run_single(worker: &mut EngineWorker, links: &mut Links, bell: &Doorbell, stop: &AtomicBool, clock: Clock, busy_poll: bool) {
    let mut idle = Idle::new(busy_poll);
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let now = clock.at(t0);
        let mut n = 0;
        for side in [Side::Inside, Side::Outside] {
            n += links.receive(side, now, &mut |id, _, stage| {
                stage.hold(side, id);
                true
            });
        }
        worker.received += n as u64;
        if n > 0 {
            worker.work.begin();
        }
        let Links { stage, ports, .. } = links;
        stage.translate_held(ports.as_mut(), |sides, frames, verdicts| worker.translate_batch(sides, frames, now, verdicts));
        worker.housekeeping(now, &mut |to, f| links.stage.push(to, f));
        while let Ok(cmd) = worker.commands.try_recv() {
            worker.command(cmd, Some(links));
        }
        let listing = worker.make_listings();
        links.flush(now);
        worker.work.round(n > 0);
        if idle.should_sleep(n, n > 0 || listing, now) {
            bell.going_to_sleep();
            links.wait(bell.fd(), sleep_ms(now, worker.engine.next_wake_ns()));
            bell.woke();
        }
    }
    worker.finish();
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_worker(
    worker: &mut EngineWorker,
    mut input: Consumer,
    mut output: Producer,
    bell: &Doorbell,
    io_bell: &Doorbell,
    stop: &AtomicBool,
    clock: Clock,
    busy_poll: bool,
) {
    let mut idle = Idle::new(busy_poll);
    // Held frames that found the output ring full: they must still go back
    // to the interfaces' owner, or their buffers would be lost to it.
    let mut unreturned: Vec<FrameId> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let now = clock.at(t0);
        let mut dropped = 0;
        let waiting = unreturned.len();
        unreturned.retain(|&id| !output.push_release(id));
        let returned = unreturned.len() < waiting;
        let n = worker.translate_popped(&mut input, now, |frame, verdict, held| {
            let sent = match (verdict, held) {
                (Verdict::Forward(to), Some(id)) => output.push_held(to, id),
                (Verdict::Forward(to), None) => output.push(to, frame),
                (_, Some(id)) => {
                    if !output.push_release(id) {
                        unreturned.push(id);
                    }
                    return;
                }
                (_, None) => return,
            };
            if !sent {
                dropped += 1;
                if let Some(id) = held {
                    unreturned.push(id);
                }
            }
        });
        let mut pushed = n > 0 || returned;
        worker.housekeeping(now, &mut |to, f| {
            pushed = true;
            dropped += u64::from(!output.push(to, f));
        });
        worker.handoff_dropped += dropped;
        while let Ok(cmd) = worker.commands.try_recv() {
            worker.command(cmd, None);
        }
        let listing = worker.make_listings();
        if pushed {
            // Frames from timers (held SYN answers) count too.
            io_bell.ring();
        }
        worker.work.round(n > 0);
        // Held frames the full output ring would not take yet keep the
        // thread polling until it does: nothing would wake it for them.
        if idle.should_sleep(n, n > 0 || listing || !unreturned.is_empty(), now) {
            bell.going_to_sleep();
            if input.is_empty() {
                wait_readable(&[bell.fd()], sleep_ms(now, worker.engine.next_wake_ns()));
            }
            bell.woke();
        }
    }
    worker.finish();
}

/// Hands the logger an item without waiting (the packet path never waits
/// for the log, CONTRACTS): one the full channel cannot take is counted
/// lost.
fn offer(events: &SyncSender<Logged>, lost: &mut u64, item: Logged) {
    if let Err(TrySendError::Full(_)) = events.try_send(item) {
        *lost += 1;
    }
}
