//! RFC 5382 REQ-4: an unsolicited inbound SYN (no TCP mapping at its
//! external address and port) is held for a while before it is answered
//! with ICMP port unreachable, and dropped silently if the subscriber's own
//! SYN for that connection goes out meanwhile (simultaneous open).
//!
//! Holds wait on the timer wheel by the second their hold ends; once that
//! second has begun they are ripe, and each is answered at its own
//! nanosecond, stamped with it.

use std::collections::VecDeque;

use crate::config::UnsolicitedSyn;
use crate::pipeline::router::Router;
use crate::state::timers::Wheel;

/// Enough of a held SYN's frame to quote its IP header and 8 bytes of TCP.
const HELD_SYN_BYTES: usize = 128;
const NS: u64 = 1_000_000_000;
/// Holds last seconds: a short wheel covers them.
const WHEEL_SLOTS: u32 = 64;

struct HeldSyn {
    deadline_ns: u64,
    /// The second (mod 2^16) its wheel entry fires.
    armed: u16,
    ext_addr: u32,
    ext_port: u16,
    rem_addr: u32,
    rem_port: u16,
    l3: usize,
    len: usize,
    bytes: [u8; HELD_SYN_BYTES],
}

pub(super) struct HeldSyns {
    slots: Vec<Option<HeldSyn>>,
    free: Vec<u32>,
    timers: Wheel<WHEEL_SLOTS>,
    /// Holds whose second has begun, in deadline order.
    ripe: VecDeque<u32>,
    held: usize,
    max: usize,
}

impl HeldSyns {
    pub fn new(max: usize) -> HeldSyns {
        HeldSyns { slots: Vec::new(), free: Vec::new(), timers: Wheel::new(), ripe: VecDeque::new(), held: 0, max }
    }

    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Holds the SYN in `frame` (IPv4 header at `l3`) sent to `ext_addr:ext_port`
    /// from `rem_addr:rem_port` until `deadline_ns`; beyond the bound it is only dropped.
    #[allow(clippy::too_many_arguments)]
    pub fn hold(&mut self, frame: &[u8], l3: usize, ext_addr: u32, ext_port: u16, rem_addr: u32, rem_port: u16, deadline_ns: u64) {
        if self.held >= self.max {
            return;
        }
        let len = frame.len().min(HELD_SYN_BYTES);
        let mut bytes = [0u8; HELD_SYN_BYTES];
        bytes[..len].copy_from_slice(&frame[..len]);
        let idx = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            (self.slots.len() - 1) as u32
        });
        let second = (deadline_ns / NS) as u32;
        let armed = if second <= self.timers.done() {
            self.ripen(idx, deadline_ns);
            0
        } else {
            self.timers.arm(idx, second) as u16
        };
        self.slots[idx as usize] = Some(HeldSyn { deadline_ns, armed, ext_addr, ext_port, rem_addr, rem_port, l3, len, bytes });
        self.held += 1;
    }

    /// An outbound SYN for a held connection silences the held one.
    pub fn cancel(&mut self, ext_addr: u32, ext_port: u16, rem_addr: u32, rem_port: u16) {
        let matches = |h: &HeldSyn| h.ext_addr == ext_addr && h.ext_port == ext_port && h.rem_addr == rem_addr && h.rem_port == rem_port;
        let gone: Vec<u32> = (0..self.slots.len() as u32).filter(|&i| self.slots[i as usize].as_ref().is_some_and(matches)).collect();
        for idx in gone {
            self.ripe.retain(|&r| r != idx);
            self.release(idx);
        }
    }

    /// Answers every hold that ended by `now_ns`.
    pub fn answer_due(&mut self, now_ns: u64, policy: UnsolicitedSyn, router: &mut Router) {
        if self.held == 0 {
            return;
        }
        let mut timers = std::mem::take(&mut self.timers);
        let mask = timers.mask();
        timers.run((now_ns / NS) as u32, |idx, firing| {
            if let Some(h) = self.slots[idx as usize].as_ref().filter(|h| firing.is_current(h.armed, mask)) {
                let deadline = h.deadline_ns;
                self.ripen(idx, deadline);
            }
            None
        });
        self.timers = timers;
        while let Some(&idx) = self.ripe.front() {
            if self.slots[idx as usize].as_ref().is_some_and(|h| h.deadline_ns > now_ns) {
                break;
            }
            self.ripe.pop_front();
            if let Some(h) = self.release(idx) {
                answer(&h, policy, router);
            }
        }
    }

    /// Answers every hold as if it had ended (the end of a capture), in deadline order.
    pub fn answer_all(&mut self, policy: UnsolicitedSyn, router: &mut Router) {
        let mut all: Vec<HeldSyn> = self.slots.iter_mut().filter_map(Option::take).collect();
        all.sort_by_key(|h| h.deadline_ns);
        for h in &all {
            answer(h, policy, router);
        }
        self.free = (0..self.slots.len() as u32).collect();
        self.ripe.clear();
        self.held = 0;
    }

    /// Queues a hold whose second has begun, keeping deadline order.
    fn ripen(&mut self, idx: u32, deadline_ns: u64) {
        let slots = &self.slots;
        let at = self.ripe.iter().position(|&r| slots[r as usize].as_ref().is_some_and(|h| h.deadline_ns > deadline_ns)).unwrap_or(self.ripe.len());
        self.ripe.insert(at, idx);
    }

    fn release(&mut self, idx: u32) -> Option<HeldSyn> {
        let h = self.slots[idx as usize].take()?;
        self.free.push(idx);
        self.held -= 1;
        Some(h)
    }
}

fn answer(h: &HeldSyn, policy: UnsolicitedSyn, router: &mut Router) {
    if policy == UnsolicitedSyn::IcmpPortUnreachable {
        router.answer_held_syn(&h.bytes[..h.len], h.l3, h.ext_addr, h.deadline_ns);
    }
}
