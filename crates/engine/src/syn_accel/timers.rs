//! The accelerator's timers: the shared wheel of seconds for what falls due
//! in a later second, and the current second in 1000 millisecond slots.
//! Arming is a push onto one slot's vector and expiry takes whole slots, so
//! both cost O(1) per timer whatever the number pending (seed 003's
//! prototype kept a sorted queue, O(n) per insertion, and named it its
//! bottleneck). A millisecond slot runs once it has ended: its timers have
//! all fallen due; the owner stamps what it sends with each timer's own
//! time, not the slot's. An entry in the seconds wheel carries its
//! millisecond slot beside the owner's id, so moving it into the current
//! second reads nothing else; every timer lies within the wheel's span
//! (`MAX_AHEAD_NS`).

use crate::state::timers::Wheel;

const NS: u64 = 1_000_000_000;
const SLOT_NS: u64 = 1_000_000;
const SLOTS: usize = (NS / SLOT_NS) as usize;
/// Seconds the wheel spans.
const WHEEL_SECONDS: u32 = 64;
/// How far ahead a timer may be armed: within the wheel's span.
pub(super) const MAX_AHEAD_NS: u64 = 60 * NS;
/// Ids fit in 22 bits; the millisecond slot (below 1000) takes the other 10.
pub(super) const MAX_IDS: usize = 1 << 22;
const SLOT_SHIFT: u32 = 22;

pub(super) struct Timers {
    seconds: Wheel<WHEEL_SECONDS>,
    slots: Vec<Vec<u32>>,
    /// The second `slots` stand for; the wheel has run up to it.
    second: u32,
    /// Slots before this one have run.
    next_slot: usize,
    /// Timers armed, and those of them in `slots`.
    armed: usize,
    in_slots: usize,
}

fn second_of(ns: u64) -> u32 {
    (ns / NS) as u32
}

/// The slot of a time within its second.
fn slot_of(ns: u64) -> usize {
    ((ns % NS) / SLOT_NS) as usize
}

impl Timers {
    pub fn new() -> Timers {
        Timers { seconds: Wheel::new(), slots: (0..SLOTS).map(|_| Vec::new()).collect(), second: 0, next_slot: 0, armed: 0, in_slots: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.armed == 0
    }

    /// Brings an idle clock to `now_ns` before the first timer after a
    /// quiet spell is armed (a busy one is brought there by `expire`,
    /// which runs whenever a slot ends).
    pub fn catch_up_idle(&mut self, now_ns: u64) {
        if self.armed != 0 {
            return;
        }
        let now_s = second_of(now_ns);
        if now_s > self.second {
            self.seconds.run(now_s, |_, _| None);
            self.second = now_s;
            self.next_slot = 0;
        }
        if now_s == self.second {
            self.next_slot = self.next_slot.max(slot_of(now_ns));
        }
    }

    /// Arms timer `id` (below `MAX_IDS`) for `due_ns`, at most
    /// `MAX_AHEAD_NS` ahead; one already due runs with the next slot to end.
    pub fn arm(&mut self, id: u32, due_ns: u64) {
        debug_assert!((id as usize) < MAX_IDS);
        self.armed += 1;
        let s = second_of(due_ns);
        if s > self.second {
            self.seconds.arm(id | (slot_of(due_ns) as u32) << SLOT_SHIFT, s);
            return;
        }
        let slot = if s == self.second { slot_of(due_ns).max(self.next_slot) } else { self.next_slot };
        self.slots[slot].push(id);
        self.in_slots += 1;
    }

    /// When `expire` next has work: the end of the current slot while
    /// timers wait in this second's slots, else the next second.
    pub fn next_wake_ns(&self) -> u64 {
        match (self.armed, self.in_slots) {
            (0, _) => u64::MAX,
            (_, 0) => (u64::from(self.second) + 1) * NS,
            _ => u64::from(self.second) * NS + (self.next_slot as u64 + 1) * SLOT_NS,
        }
    }

    /// Takes every timer due by `now_ns` into `due`, slot by slot in time order.
    pub fn expire(&mut self, now_ns: u64, due: &mut Vec<u32>) {
        let start = due.len();
        let now_s = second_of(now_ns);
        if now_s > self.second {
            self.take_slots(SLOTS, due);
            let Timers { seconds, slots, in_slots, .. } = self;
            seconds.run(now_s, |entry, firing| {
                let id = entry & (MAX_IDS as u32 - 1);
                if firing.second < now_s {
                    due.push(id);
                } else {
                    slots[(entry >> SLOT_SHIFT) as usize].push(id);
                    *in_slots += 1;
                }
                None
            });
            self.second = now_s;
            self.next_slot = 0;
        }
        self.take_slots(slot_of(now_ns), due);
        self.armed -= due.len() - start;
    }

    /// Takes the slots from `next_slot` up to (not including) `end`.
    fn take_slots(&mut self, end: usize, due: &mut Vec<u32>) {
        for slot in &mut self.slots[self.next_slot.min(end)..end] {
            self.in_slots -= slot.len();
            due.append(slot);
        }
        self.next_slot = self.next_slot.max(end);
    }

    pub fn memory_bytes(&self) -> usize {
        self.seconds.memory_bytes() + self.slots.iter().map(|s| s.capacity() * 4).sum::<usize>() + self.slots.capacity() * core::mem::size_of::<Vec<u32>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = SLOT_NS;
    const T0: u64 = 1_700_000_000 * NS;

    /// Runs the timers at every `step` up to `until` and says when each fired.
    fn fired(t: &mut Timers, dues: &[(u32, u64)], from: u64, until: u64, step: u64) -> Vec<(u32, u64)> {
        let due_of = |id: u32| dues.iter().find(|d| d.0 == id).unwrap().1;
        let mut out = Vec::new();
        let mut now = from;
        while now <= until {
            let mut due = Vec::new();
            t.expire(now, &mut due);
            for id in due {
                assert!(due_of(id) <= now, "timer {id} due {} fired early at {now}", due_of(id));
                out.push((id, now));
            }
            now += step;
        }
        out
    }

    #[test]
    fn timers_fire_in_the_first_run_after_their_slot_ends() {
        let mut t = Timers::new();
        t.catch_up_idle(T0);
        let dues = [(1, T0 + 500 * MS), (2, T0 + 1_500 * MS + 300_000), (3, T0 + 2_000 * MS), (4, T0 + 60 * NS)];
        for &(id, d) in &dues {
            t.arm(id, d);
        }
        let got = fired(&mut t, &dues, T0, T0 + 61 * NS, 100_000);
        let at = |id| got.iter().find(|g| g.0 == id).unwrap().1;
        assert_eq!(at(1), T0 + 501 * MS);
        assert_eq!(at(2), T0 + 1_501 * MS);
        assert_eq!(at(3), T0 + 2_001 * MS);
        assert_eq!(at(4), T0 + 60 * NS + MS, "as far ahead as may be");
        assert!(t.is_empty());
    }

    #[test]
    fn a_jump_over_seconds_fires_everything_due_once_in_time_order_by_second() {
        let mut t = Timers::new();
        t.catch_up_idle(T0);
        let dues = [(1, T0 + 2 * NS + 5), (2, T0 + 300 * MS), (3, T0 + 9 * NS), (4, T0 + 3 * NS + 700 * MS)];
        for &(id, d) in &dues {
            t.arm(id, d);
        }
        let mut due = Vec::new();
        t.expire(T0 + 3 * NS + 800 * MS, &mut due);
        assert_eq!(due, [2, 1, 4]);
        assert_eq!(t.next_wake_ns(), T0 + 4 * NS, "only a later second's timer is left");
    }

    #[test]
    fn the_wake_is_the_end_of_the_current_slot_while_this_second_has_timers() {
        let mut t = Timers::new();
        assert_eq!(t.next_wake_ns(), u64::MAX);
        t.catch_up_idle(T0 + 250 * MS + 10);
        t.arm(7, T0 + 251 * MS);
        assert_eq!(t.next_wake_ns(), T0 + 251 * MS);
        t.arm(8, T0 + 100 * MS);
        let mut due = Vec::new();
        t.expire(T0 + 251 * MS, &mut due);
        assert_eq!(due, [8], "an overdue timer runs with the current slot; 7's slot has not ended");
    }
}
