//! The timer wheel everything that waits uses: idle sessions, held SYNs and
//! PCP holds (each owner keeps one, and the engine runs them in a fixed
//! order each second). Slots are whole seconds; an entry is a `u32` its
//! owner understands (a session id, a slab index). Arming never touches
//! anything but the slot's vector, so a refresh costs no neighbour's cache
//! line; an owner that re-arms an entry elsewhere leaves the old copy to be
//! recognised as stale when its slot runs (the owner keeps the second each
//! live entry is armed for).

/// How a slot is being run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Firing {
    /// The second whose slot this is.
    pub second: u32,
    /// The clock jumped past the whole wheel: every slot runs once, holding
    /// entries armed for some second before now.
    pub jump: bool,
    now_s: u32,
    span: u32,
}

impl Firing {
    /// Whether an entry found in this slot is the one armed for `armed`
    /// (the second it was armed for, modulo 2^16), not a stale copy.
    pub fn is_current(&self, armed: u16, mask: u32) -> bool {
        if self.jump {
            u32::from(armed) & mask == self.second & mask
        } else {
            armed == self.second as u16
        }
    }

    /// The second an entry re-armed now for `due` will fire at.
    pub fn rearm_second(&self, due: u32) -> u32 {
        due.clamp(self.now_s + 1, self.now_s + self.span)
    }
}

/// A wheel of `SLOTS` one-second slots (a power of two, fixed so the slot
/// arithmetic folds to constants): an entry due further away waits in the
/// last slot and is re-armed when that fires. The default wheel has no
/// slots: only a placeholder while its owner runs it.
#[derive(Default)]
pub struct Wheel<const SLOTS: u32> {
    slots: Vec<Vec<u32>>,
    /// The last second whose slot has been run.
    done: u32,
}

impl<const SLOTS: u32> Wheel<SLOTS> {
    const MASK: u32 = {
        assert!(SLOTS.is_power_of_two());
        SLOTS - 1
    };

    pub fn new() -> Self {
        Wheel { slots: (0..SLOTS).map(|_| Vec::new()).collect(), done: 0 }
    }

    pub fn mask(&self) -> u32 {
        Self::MASK
    }

    /// The last second run.
    pub fn done(&self) -> u32 {
        self.done
    }

    /// The full second an entry armed for `armed` (mod 2^16) fires at: it
    /// always lies within the wheel's span after the last second run.
    pub fn armed_second(&self, armed: u16) -> u32 {
        let ahead = armed.wrapping_sub(self.done as u16);
        self.done + u32::from(ahead)
    }

    /// Queues `entry` for second `due`, or as close to it as the wheel
    /// reaches; returns the second it will fire at.
    #[inline(always)]
    pub fn arm(&mut self, entry: u32, due: u32) -> u32 {
        let at = due.clamp(self.done + 1, self.done + SLOTS);
        self.slots[(at & Self::MASK) as usize].push(entry);
        at
    }

    /// Runs every slot up to `now_s`: `fire` sees each entry with how its
    /// slot runs, and returns the second to re-arm it for, if any (use
    /// `Firing::rearm_second` to learn where it will fire).
    pub fn run(&mut self, now_s: u32, mut fire: impl FnMut(u32, Firing) -> Option<u32>) {
        if now_s <= self.done {
            return;
        }
        let (span, mask) = (SLOTS, Self::MASK);
        let jump = now_s - self.done > span;
        let first = if jump { now_s - span + 1 } else { self.done + 1 };
        for t in first..=now_s {
            let slot = (t & mask) as usize;
            let mut entries = std::mem::take(&mut self.slots[slot]);
            let firing = Firing { second: t, jump, now_s, span };
            for &e in &entries {
                if let Some(due) = fire(e, firing) {
                    let at = firing.rearm_second(due);
                    self.slots[(at & mask) as usize].push(e);
                }
            }
            // Keep the slot's allocation for its next turn.
            entries.clear();
            entries.append(&mut self.slots[slot]);
            self.slots[slot] = entries;
        }
        self.done = now_s;
    }

    /// Bytes of the slots' vectors as allocated.
    pub fn memory_bytes(&self) -> usize {
        self.slots.iter().map(|s| s.capacity() * 4).sum::<usize>() + self.slots.capacity() * core::mem::size_of::<Vec<u32>>()
    }

    /// Bytes a new wheel takes.
    pub fn bytes() -> usize {
        SLOTS as usize * core::mem::size_of::<Vec<u32>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arms entries and records when each fires; re-arms none.
    fn fired_at(wheel: &mut Wheel<8>, until: u32) -> Vec<(u32, u32)> {
        let mut fired = Vec::new();
        for now in wheel.done() + 1..=until {
            wheel.run(now, |e, f| {
                fired.push((e, f.second));
                None
            });
        }
        fired
    }

    #[test]
    fn entries_fire_in_their_second_and_far_ones_wait_in_the_last_slot() {
        let mut w = Wheel::<8>::new();
        assert_eq!(w.arm(1, 3), 3);
        assert_eq!(w.arm(2, 0), 1, "a due time already past fires next second");
        assert_eq!(w.arm(3, 100), 8, "beyond the span: the last slot");
        assert_eq!(fired_at(&mut w, 8), [(2, 1), (1, 3), (3, 8)]);
    }

    #[test]
    fn a_reamed_entry_fires_again_where_it_was_sent() {
        let mut w = Wheel::<8>::new();
        w.arm(7, 2);
        let mut seen = Vec::new();
        for now in 1..=12 {
            w.run(now, |e, f| {
                seen.push((e, f.second));
                (f.second < 10).then_some(f.second + 5)
            });
        }
        assert_eq!(seen, [(7, 2), (7, 7), (7, 12)]);
    }

    #[test]
    fn a_jump_past_the_wheel_runs_every_slot_once() {
        let mut w = Wheel::<8>::new();
        for e in 0..8 {
            w.arm(e, e + 1);
        }
        let mut seen = Vec::new();
        w.run(1000, |e, f| {
            assert!(f.jump);
            seen.push(e);
            None
        });
        seen.sort_unstable();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        assert_eq!(w.done(), 1000);
    }

    #[test]
    fn armed_seconds_read_back_within_the_span() {
        let mut w = Wheel::<4096>::new();
        w.run(70_000, |_, _| None);
        let at = w.arm(0, 70_500);
        assert_eq!(w.armed_second(at as u16), 70_500);
    }
}
