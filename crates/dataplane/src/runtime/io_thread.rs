//! A worker that owns receive queues besides its engine. It translates
//! the frames it owns where they lie, steers every other IP frame to the
//! worker that owns its state, and translates and sends what other workers
//! steer to it.
//!
//! Two arrangements use it. On interfaces with a queue per worker, every
//! worker is one (per-queue workers): each serves its own queues of both
//! interfaces, sends from its own sockets, and owners exchange frames over
//! a ring from every worker to every other. Elsewhere (veth's one queue,
//! AF_PACKET) the first worker is the only one: it owns both interfaces,
//! and the other workers take their frames from it and hand them back
//! (`run_worker`) for it to send. Either way N workers are N threads,
//! which on a small host leaves the CPUs to the engines.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use natrix_engine::Side;
use natrix_wire::{ethernet, ipv4};

use super::clock::{sleep_ms, Clock, Idle};
use super::commands::Command;
use super::links::Links;
use super::stage::{Next, Stage, Staged};
use super::worker::EngineWorker;
use super::BATCH;
use crate::ring::{Consumer, Doorbell, Popped, Producer};
use crate::steer::Steering;
use natrix_engine::Verdict;
use natrix_io::{FrameId, FramePorts};

/// Links to the workers: `to_workers[w]` feeds worker w, this one's own
/// included (hairpins to its own mappings go round through it), and
/// `doorbells[w]` wakes it; `from_workers[i]` brings back what worker
/// i + 1 translated, where this is the only worker with interfaces.
#[derive(Default)]
pub(super) struct Lanes {
    pub(super) to_workers: Vec<Producer>,
    pub(super) from_workers: Vec<Consumer>,
    pub(super) doorbells: Vec<std::sync::Arc<Doorbell>>,
}

pub(super) struct IoThread {
    /// This worker's index among the workers.
    pub(super) index: usize,
    pub(super) worker: EngineWorker,
    pub(super) links: Links,
    pub(super) lanes: Lanes,
    /// Frames the workers steer to this one for its engine.
    pub(super) inputs: Vec<Consumer>,
    pub(super) steering: Steering,
    /// Sorted, to recognise hairpins to another worker's mapping.
    pub(super) pool: Vec<u32>,
    /// Held frames of one receive batch on their way to other workers:
    /// handed on only once the batch's views of them are gone.
    pub(super) handoffs: Vec<(usize, FrameId)>,
}

impl IoThread {
    pub(super) fn run(&mut self, bell: &Doorbell, stop: &AtomicBool, clock: Clock, busy_poll: bool) {
        let mut idle = Idle::new(busy_poll);
        let mut woken = vec![false; self.lanes.to_workers.len()];
        while !stop.load(Ordering::Relaxed) {
            let t0 = Instant::now();
            let now = clock.at(t0);
            // Frames that reached this thread from outside its own loop: a
            // frame the workers hand back was counted when it was received.
            let arrived = self.receive_and_steer(now, &mut woken) + self.translate_own(now, &mut woken);
            let mut n = arrived;
            let collected = self.collect_from_workers(&mut woken);
            if collected > 0 {
                // What the workers hand back is sent at the flush below.
                self.worker.work.begin();
            }
            n += collected;
            for (w, (bell, woken)) in self.lanes.doorbells.iter().zip(woken.iter_mut()).enumerate() {
                if std::mem::take(woken) && w != self.index {
                    bell.ring();
                }
            }
            self.links.flush(now);
            while let Ok(cmd) = self.worker.commands.try_recv() {
                self.command(cmd);
            }
            let listing = self.worker.make_listings();
            self.worker.work.round(n > 0);
            if idle.should_sleep(arrived, n > 0 || listing, now) {
                bell.going_to_sleep();
                if self.lanes.from_workers.iter().chain(&self.inputs).all(Consumer::is_empty) {
                    self.links.wait(bell.fd(), sleep_ms(now, self.worker.next_wake_ns()));
                }
                bell.woke();
            }
        }
        self.worker.finish();
    }

    /// Receives from both interfaces: frames this worker owns stay where
    /// they lie for its engine; the others go to their owners' rings.
    fn receive_and_steer(&mut self, now: u64, woken: &mut [bool]) -> usize {
        let mut n = 0;
        for side in [Side::Inside, Side::Outside] {
            let IoThread { index, links, lanes, steering, handoffs, .. } = self;
            let mut dropped = 0;
            let low = links.ports.low_on_buffers();
            n += links.receive(side, now, &mut |id, frame, stage| match usize::from(steering.worker_for(side, frame)) {
                w if w == *index => {
                    stage.hold(side, id);
                    true
                }
                // The frame goes to its worker where it lies, unless buffers
                // run short (a worker falling behind must not take them all
                // from the interfaces): then as a copy. A full ring drops it.
                w if !low => {
                    handoffs.push((w, id));
                    true
                }
                w if lanes.to_workers[w].push(side, frame) => {
                    woken[w] = true;
                    false
                }
                _ => {
                    dropped += 1;
                    false
                }
            });
            for (w, id) in handoffs.drain(..) {
                if lanes.to_workers[w].push_held(side, id) {
                    woken[w] = true;
                } else {
                    dropped += 1;
                    // SAFETY: the frame was received and kept for this handoff.
                    unsafe { links.ports.release(id) };
                }
            }
            links.snapshot.handoff_dropped += dropped;
        }
        self.worker.received += n as u64;
        if n > 0 {
            self.worker.work.begin();
        }
        n
    }

    /// Translates this worker's frames where they lie and those steered to
    /// it (by other workers, and hairpins to its mappings), runs the
    /// engine's timers, and hands each frame of the round that leaves for
    /// another worker's mapping to it; returns how many frames were
    /// steered to it.
    fn translate_own(&mut self, now: u64, woken: &mut [bool]) -> usize {
        let IoThread { worker, links, inputs, .. } = self;
        let Links { stage, ports, .. } = links;
        stage.translate_held(ports.as_mut(), |sides, frames, verdicts| worker.translate_batch(sides, frames, now, verdicts));
        let steered: usize = inputs.iter_mut().map(|input| translate_steered(worker, stage, ports.as_mut(), input, now)).sum();
        worker.housekeeping(now, &mut |to, f| stage.push(to, f));
        self.hand_over_hairpins(woken);
        steered
    }

    /// Frames of the round leaving outside (translated here, or made by
    /// this engine: reassembled fragments, rebuilt softwire and HOST_ID
    /// frames) teach steering their flows; those to a pool address are
    /// hairpins to a mapping this engine does not own, and go to its owner.
    fn hand_over_hairpins(&mut self, woken: &mut [bool]) {
        let IoThread { index, links, lanes, steering, pool, .. } = self;
        let Links { stage, ports, snapshot, .. } = links;
        let low = ports.low_on_buffers();
        let Stage { bytes, frames, .. } = stage;
        for f in frames.iter_mut() {
            let (Side::Outside, staged, Next::Route) = *f else { continue };
            let frame: &[u8] = match staged {
                // SAFETY: the stage holds id.
                Staged::Held(id) => unsafe { ports.frame(id) },
                Staged::Made { at, len } => &bytes[at..at + len],
            };
            let Some(owner) = sent_outside(steering, pool, *index as u16, frame) else { continue };
            let handed = match (owner, staged) {
                (Some(w), Staged::Held(id)) if !low => lanes.to_workers[w].push_held(Side::Outside, id),
                (Some(w), _) => lanes.to_workers[w].push(Side::Outside, frame),
                (None, _) => false,
            };
            f.2 = match (handed, owner, staged) {
                (true, Some(w), Staged::Held(_)) if !low => {
                    woken[w] = true;
                    Next::Handed
                }
                (true, Some(w), _) => {
                    woken[w] = true;
                    Next::Nothing
                }
                _ => {
                    snapshot.handoff_dropped += 1;
                    Next::Nothing
                }
            };
        }
    }

    /// Stages what the other workers translated, to be sent at the flush;
    /// a frame leaving outside for a pool address is a hairpin between
    /// workers and goes back in to the owner.
    fn collect_from_workers(&mut self, woken: &mut [bool]) -> usize {
        let mut n = 0;
        let IoThread { links, lanes, steering, pool, .. } = self;
        let Lanes { to_workers, from_workers, .. } = lanes;
        for (i, from) in from_workers.iter_mut().enumerate() {
            let worker = i + 1;
            // Each worker gets the same budget, so one backlog cannot starve the others.
            let mut budget = BATCH;
            while budget > 0 {
                // What becomes of a held frame is decided while the ring
                // shows it, and done once it no longer does.
                let mut then = None;
                let popped = from.pop(|popped| {
                    let (side, frame, held) = match popped {
                        Popped::Frame(side, frame, held) => (side, frame, held),
                        Popped::Release(id) => {
                            then = Some(Then::Release(id));
                            return;
                        }
                    };
                    let hairpin = if side == Side::Outside { sent_outside(steering, pool, worker as u16, frame) } else { None };
                    if let Some(w) = hairpin {
                        match (w, held) {
                            (Some(w), Some(id)) => then = Some(Then::Hairpin(w, id)),
                            (Some(w), None) if to_workers[w].push(Side::Outside, frame) => woken[w] = true,
                            (_, held) => {
                                links.snapshot.handoff_dropped += 1;
                                then = held.map(Then::Release);
                            }
                        }
                    } else if let Some(id) = held {
                        links.stage.forward_held(side, id);
                    } else {
                        links.stage.push(side, frame);
                    }
                });
                if !popped {
                    break;
                }
                match then {
                    Some(Then::Hairpin(w, id)) if to_workers[w].push_held(Side::Outside, id) => woken[w] = true,
                    Some(Then::Hairpin(_, id)) => {
                        links.snapshot.handoff_dropped += 1;
                        // SAFETY: the worker handed the frame back.
                        unsafe { links.ports.release(id) };
                    }
                    // SAFETY: as above.
                    Some(Then::Release(id)) => unsafe { links.ports.release(id) },
                    None => {}
                }
                budget -= 1;
                n += 1;
            }
        }
        n
    }

    fn command(&mut self, cmd: Command) {
        if let Command::ReloadLinks(reload, _) = &cmd {
            self.pool = reload.pool.clone();
        }
        self.worker.command(cmd, Some(&mut self.links));
    }
}

/// Translates, up to a batch, the frames `input` brings: held ones where
/// they lie, to be routed at the flush; copies into the stage. Returns
/// how many it took.
fn translate_steered(worker: &mut EngineWorker, stage: &mut Stage, ports: &mut dyn FramePorts, input: &mut Consumer, now: u64) -> usize {
    let mut taken = 0;
    while taken < BATCH {
        let popped = worker.translate_popped(input, now, |frame, verdict, held| match (verdict, held) {
            (Verdict::Forward(to), Some(id)) => stage.forward_held(to, id),
            (Verdict::Forward(to), None) => stage.push(to, frame),
            // SAFETY: the popped frame was handed to this thread.
            (_, Some(id)) => unsafe { ports.release(id) },
            (_, None) => {}
        });
        if popped == 0 {
            break;
        }
        taken += popped;
    }
    taken
}

/// What the interface thread does with a held frame a worker handed back.
enum Then {
    /// Hands it to worker `w`, whose mapping it hairpins to.
    Hairpin(usize, FrameId),
    Release(FrameId),
}

/// A frame worker `from` sends out of the outside interface: steering
/// learns its flow; a hairpin (to a pool address, so to a mapping of
/// whichever worker owns it) gives `Some(owner)`, anything else `None`.
fn sent_outside(steering: &mut Steering, pool: &[u32], from: u16, frame: &[u8]) -> Option<Option<usize>> {
    steering.learn_sent(from, frame);
    is_to_pool(frame, pool).then(|| steering.hairpin_owner(frame).map(usize::from))
}

/// An IPv4 frame whose destination is a pool address.
fn is_to_pool(frame: &[u8], pool: &[u32]) -> bool {
    let Ok(eth) = ethernet::Frame::new_checked(frame) else { return false };
    if eth.ethertype() != ethernet::ETHERTYPE_IPV4 {
        return false;
    }
    ipv4::Packet::new_lax(&frame[eth.payload_offset()..]).is_ok_and(|ip| pool.binary_search(&ip.dst_addr()).is_ok())
}
