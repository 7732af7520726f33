//! The I/O thread of a dataplane with several workers: it owns both
//! interfaces and the gateway, steers each received IP frame to the worker
//! that owns its state, and sends what the workers hand back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use natrix_engine::Side;
use natrix_wire::{ethernet, ipv4};

use super::clock::{Clock, Idle, SLEEP_MS};
use super::commands::Command;
use super::links::Links;
use super::BATCH;
use crate::ring::{wait_readable, Consumer, Doorbell, Producer};
use crate::steer::Steering;

/// The I/O thread's links to the workers, one entry per worker in each:
/// kept apart so a frame popped from one worker can go straight to another.
#[derive(Default)]
pub(super) struct Lanes {
    pub(super) to_workers: Vec<Producer>,
    pub(super) from_workers: Vec<Consumer>,
    pub(super) doorbells: Vec<Arc<Doorbell>>,
}

pub(super) struct IoThread {
    pub(super) links: Links,
    pub(super) lanes: Lanes,
    pub(super) steering: Steering,
    /// Sorted, to recognise hairpins a worker handed back.
    pub(super) pool: Vec<u32>,
    pub(super) commands: Receiver<Command>,
}

impl IoThread {
    pub(super) fn run(&mut self, bell: &Doorbell, stop: &AtomicBool, clock: Clock, busy_poll: bool) {
        let mut idle = Idle::new(busy_poll);
        let mut woken = vec![false; self.lanes.to_workers.len()];
        while !stop.load(Ordering::Relaxed) {
            let now = clock.now_ns();
            let mut n = 0;
            for side in [Side::Inside, Side::Outside] {
                let IoThread { links, lanes, steering, .. } = self;
                let mut dropped = 0;
                n += links.receive(side, now, &mut |_, frame, _| {
                    let w = usize::from(steering.worker_for(side, frame));
                    if lanes.to_workers[w].push(side, frame) {
                        woken[w] = true;
                    } else {
                        dropped += 1;
                    }
                    // The worker has its copy.
                    false
                });
                links.snapshot.handoff_dropped += dropped;
            }
            n += self.collect_from_workers(now, &mut woken);
            for (bell, w) in self.lanes.doorbells.iter().zip(woken.iter_mut()) {
                if std::mem::take(w) {
                    bell.ring();
                }
            }
            self.links.flush(now);
            while let Ok(cmd) = self.commands.try_recv() {
                self.command(cmd);
            }
            if idle.should_sleep(n > 0) {
                bell.going_to_sleep();
                if self.lanes.from_workers.iter().all(Consumer::is_empty) {
                    let mut fds = self.links.fds();
                    fds.push(bell.fd());
                    wait_readable(&fds, SLEEP_MS);
                }
                bell.woke();
            }
        }
    }

    /// Sends what the workers translated; a frame leaving outside for a pool
    /// address is a hairpin between workers and goes back in to the owner.
    fn collect_from_workers(&mut self, now: u64, woken: &mut [bool]) -> usize {
        let mut n = 0;
        let IoThread { links, lanes, steering, pool, .. } = self;
        let Lanes { to_workers, from_workers, .. } = lanes;
        for (worker, from) in from_workers.iter_mut().enumerate() {
            // Each worker gets the same budget, so one backlog cannot starve the others.
            let mut budget = BATCH;
            while budget > 0
                && from.pop(|side, frame| {
                    if side == Side::Outside {
                        steering.learn_sent(worker as u16, frame);
                    }
                    if side == Side::Outside && is_to_pool(frame, pool) {
                        let w = steering.hairpin_owner(frame).map(usize::from);
                        match w {
                            Some(w) if to_workers[w].push(Side::Outside, frame) => woken[w] = true,
                            _ => links.snapshot.handoff_dropped += 1,
                        }
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
        match cmd {
            Command::Io(tx) => {
                let _ = tx.send(self.links.snapshot());
            }
            Command::ReloadLinks(answers, pool, tx) => {
                self.links.gateway.set_answers_for(Side::Outside, answers);
                self.pool = pool;
                let _ = tx.send(());
            }
            _ => {}
        }
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
