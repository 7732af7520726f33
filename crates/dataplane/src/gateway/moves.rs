//! IPv4 next hops that moved to another link-layer address (a router
//! failover's gratuitous ARP), for the XDP offload, whose flows carry their
//! next hop's address: each worker's offloader re-addresses the flows that
//! went to the old one, woken to do it at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use natrix_engine::Side;

use crate::ring::Doorbell;

/// Moves kept for offloaders that have yet to follow them; one that falls
/// further behind re-addresses every flow instead.
const KEPT: usize = 64;

/// One move: on `side`, a neighbour that was at `old` is at `new`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub side: Side,
    pub old: [u8; 6],
    pub new: [u8; 6],
}

/// What the offloaders have to catch up with.
pub enum Since {
    Moves(Vec<Move>),
    /// More moved than are kept: every flow's next hop is to be looked up.
    TooMany,
}

/// The moves so far, numbered from 1, and the workers to wake for each.
#[derive(Default)]
pub struct MoveLog {
    count: AtomicU64,
    recent: Mutex<VecDeque<Move>>,
    wake: Mutex<Vec<Arc<Doorbell>>>,
}

impl MoveLog {
    /// Moves so far: an offloader compares it with what it followed, one
    /// load a round.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The workers woken for each move, so that none sleeps through one.
    pub fn wake(&self, doorbells: Vec<Arc<Doorbell>>) {
        *lock(&self.wake) = doorbells;
    }

    pub(super) fn record(&self, m: Move) {
        {
            let mut recent = lock(&self.recent);
            if recent.len() == KEPT {
                recent.pop_front();
            }
            recent.push_back(m);
            self.count.fetch_add(1, Relaxed);
        }
        for bell in lock(&self.wake).iter() {
            bell.ring();
        }
    }

    /// The moves after the first `followed`, as of `count`.
    pub fn since(&self, followed: u64, count: u64) -> Since {
        let recent = lock(&self.recent);
        let new = usize::try_from(count - followed).unwrap_or(usize::MAX);
        // Moves recorded after `count` was read sit at the end.
        let after = usize::try_from(self.count() - count).unwrap_or(usize::MAX);
        match recent.len().checked_sub(new.saturating_add(after)) {
            Some(first) => Since::Moves(recent.iter().skip(first).take(new).copied().collect()),
            None => Since::TooMany,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(n: u8) -> Move {
        Move { side: Side::Outside, old: [2, 0, 0, 0, 0, n], new: [2, 0, 0, 0, 1, n] }
    }

    #[test]
    fn an_offloader_gets_the_moves_it_has_not_followed_in_order() {
        let log = MoveLog::default();
        log.record(mv(1));
        log.record(mv(2));
        let seen = log.count();
        log.record(mv(3));
        assert!(matches!(log.since(0, seen), Since::Moves(m) if m == [mv(1), mv(2)]), "as of the count it read");
        assert!(matches!(log.since(seen, log.count()), Since::Moves(m) if m == [mv(3)]));
        assert!(matches!(log.since(log.count(), log.count()), Since::Moves(m) if m.is_empty()));
    }

    #[test]
    fn one_that_fell_further_behind_than_is_kept_looks_up_every_flow() {
        let log = MoveLog::default();
        for n in 0..=KEPT as u8 {
            log.record(mv(n));
        }
        assert!(matches!(log.since(0, log.count()), Since::TooMany));
        assert!(matches!(log.since(1, log.count()), Since::Moves(m) if m.len() == KEPT && m[0] == mv(1)));
    }
}
