//! The first worker of a dataplane with several: besides its own engine it
//! owns both interfaces and the gateway. It translates the frames it owns
//! where they lie, steers every other IP frame to the worker that owns its
//! state, and sends what the other workers hand back. With N workers there
//! are N threads, which on a small host leaves the CPUs to the engines.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use natrix_engine::Side;
use natrix_wire::{ethernet, ipv4};

use super::clock::{Clock, Idle};
use super::commands::Command;
use super::links::Links;
use super::stage::{Next, Staged};
use super::worker::EngineWorker;
use super::BATCH;
use crate::ring::{Consumer, Doorbell, Popped, Producer, MAX_POP};
use crate::steer::Steering;
use natrix_engine::Verdict;

/// Links to the workers: `to_workers[w]` feeds worker w, the first
/// worker's own included (hairpins to its mappings that another worker
/// translated wait there, for `own_input`); `from_workers[i]` and
/// `doorbells[i]` belong to worker i + 1.
#[derive(Default)]
pub(super) struct Lanes {
    pub(super) to_workers: Vec<Producer>,
    pub(super) from_workers: Vec<Consumer>,
    pub(super) doorbells: Vec<std::sync::Arc<Doorbell>>,
}

pub(super) struct IoThread {
    pub(super) worker: EngineWorker,
    pub(super) links: Links,
    pub(super) lanes: Lanes,
    pub(super) own_input: Consumer,
    pub(super) steering: Steering,
    /// Sorted, to recognise hairpins to another worker's mapping.
    pub(super) pool: Vec<u32>,
}

impl IoThread {
    pub(super) fn run(&mut self, bell: &Doorbell, stop: &AtomicBool, clock: Clock, busy_poll: bool) {
        let mut idle = Idle::new(busy_poll);
        let mut woken = vec![false; self.lanes.to_workers.len()];
        while !stop.load(Ordering::Relaxed) {
            let t0 = Instant::now();
            let now = clock.now_ns();
            let mut n = self.receive_and_steer(now, &mut woken);
            self.translate_own(now, &mut woken);
            n += self.collect_from_workers(now, &mut woken);
            for (bell, w) in self.lanes.doorbells.iter().zip(woken.iter_mut().skip(1)) {
                if std::mem::take(w) {
                    bell.ring();
                }
            }
            self.links.flush(now);
            while let Ok(cmd) = self.worker.commands.try_recv() {
                self.command(cmd);
            }
            if n > 0 {
                self.worker.busy_ns += t0.elapsed().as_nanos() as u64;
            }
            if idle.should_sleep(n > 0) {
                bell.going_to_sleep();
                if self.lanes.from_workers.iter().all(Consumer::is_empty) && self.own_input.is_empty() {
                    self.links.wait(bell.fd());
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
            let IoThread { links, lanes, steering, .. } = self;
            let mut dropped = 0;
            n += links.receive(side, now, &mut |id, frame, stage| match usize::from(steering.worker_for(side, frame)) {
                0 => {
                    stage.hold(side, id);
                    true
                }
                // The frame goes to its worker where it lies; a full ring
                // drops it (given back at once).
                w if lanes.to_workers[w].push_held(side, id) => {
                    woken[w] = true;
                    true
                }
                _ => {
                    dropped += 1;
                    false
                }
            });
            links.snapshot.handoff_dropped += dropped;
        }
        n
    }

    /// Translates this worker's frames where they lie, hands a hairpin to
    /// another worker's mapping to that worker, and runs the engine's
    /// timers.
    fn translate_own(&mut self, now: u64, woken: &mut [bool]) {
        let IoThread { worker, links, lanes, own_input, steering, pool } = self;
        let Links { stage, ports, snapshot, .. } = links;
        stage.translate_held(ports.as_mut(), |sides, frames, verdicts| worker.translate_batch(sides, frames, now, verdicts));
        for f in stage.frames.iter_mut() {
            let (Side::Outside, Staged::Held(id), Next::Route) = *f else { continue };
            let frame = ports.frame(id);
            steering.learn_sent(0, frame);
            if is_to_pool(frame, pool) {
                f.2 = match steering.hairpin_owner(frame).map(usize::from) {
                    Some(w) if lanes.to_workers[w].push_held(Side::Outside, id) => {
                        woken[w] = true;
                        Next::Handed
                    }
                    _ => {
                        snapshot.handoff_dropped += 1;
                        Next::Nothing
                    }
                };
            }
        }
        // Hairpins to this worker's mappings, from the other workers.
        let mut taken = 0;
        while taken < BATCH {
            let popped = own_input.pop_batch(|sides, frames, held| {
                let mut verdicts = [Verdict::Held; MAX_POP];
                let verdicts = &mut verdicts[..frames.len()];
                worker.translate_batch(sides, frames, now, verdicts);
                for ((frame, v), held) in frames.iter().zip(verdicts.iter()).zip(held) {
                    match (*v, *held) {
                        (Verdict::Forward(to), Some(id)) => stage.forward_held(to, id),
                        (Verdict::Forward(to), None) => stage.push(to, frame),
                        (_, Some(id)) => ports.release(id),
                        (_, None) => {}
                    }
                }
            });
            if popped == 0 {
                break;
            }
            taken += popped;
        }
        worker.housekeeping(now, &mut |to, f| stage.push(to, f));
    }

    /// Sends what the other workers translated; a frame leaving outside for
    /// a pool address is a hairpin between workers and goes back in to the
    /// owner.
    fn collect_from_workers(&mut self, now: u64, woken: &mut [bool]) -> usize {
        let mut n = 0;
        let IoThread { links, lanes, steering, pool, .. } = self;
        let Lanes { to_workers, from_workers, .. } = lanes;
        for (i, from) in from_workers.iter_mut().enumerate() {
            let worker = i + 1;
            // Each worker gets the same budget, so one backlog cannot starve the others.
            let mut budget = BATCH;
            while budget > 0
                && from.pop(|popped| {
                    let (side, frame, held) = match popped {
                        Popped::Frame(side, frame, held) => (side, frame, held),
                        Popped::Release(id) => return links.ports.release(id),
                    };
                    if side == Side::Outside {
                        steering.learn_sent(worker as u16, frame);
                    }
                    if side == Side::Outside && is_to_pool(frame, pool) {
                        let w = steering.hairpin_owner(frame).map(usize::from);
                        let handed = match (w, held) {
                            (Some(w), Some(id)) => to_workers[w].push_held(Side::Outside, id),
                            (Some(w), None) => to_workers[w].push(Side::Outside, frame),
                            (None, _) => false,
                        };
                        match (handed, w, held) {
                            (true, Some(w), _) => woken[w] = true,
                            (_, _, Some(id)) => {
                                links.snapshot.handoff_dropped += 1;
                                links.ports.release(id);
                            }
                            _ => links.snapshot.handoff_dropped += 1,
                        }
                    } else if let Some(id) = held {
                        links.route_held(side, id, now);
                    } else {
                        links.send(side, frame, now);
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
        if let Command::ReloadLinks(_, pool, _) = &cmd {
            self.pool = pool.clone();
        }
        self.worker.command(cmd, Some(&mut self.links));
    }
}

/// An IPv4 frame whose destination is a pool address.
fn is_to_pool(frame: &[u8], pool: &[u32]) -> bool {
    let Ok(eth) = ethernet::Frame::new_checked(frame) else { return false };
    if eth.ethertype() != ethernet::ETHERTYPE_IPV4 {
        return false;
    }
    ipv4::Packet::new_lax(&frame[eth.payload_offset()..]).is_ok_and(|ip| pool.binary_search(&ip.dst_addr()).is_ok())
}
