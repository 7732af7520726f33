//! ACK mode's memory (seed 000 section 3.2.2, figure 6): the connections
//! whose server echoed HOST_ID_ENABLED in its SYN-ACK, until the client's
//! first ACK takes HOST_ID_BOUCADAIR; with `[[host_id.rule]]`s, the
//! connections whose SYN-ACK passed, until its first ACK, the one segment
//! after the SYN the rules inspect; and the connections a rule refused at
//! that first ACK, whose later client segments are refused too (as a
//! dropped SYN denies a connection), until the client starts again, the
//! rules change, or it falls silent for `REFUSED_NS`. A side table, so
//! sessions that never use it cost nothing: it holds only connections
//! between a SYN-ACK and the first ACK, and refused ones, at most half of
//! it, so that refusals a client provokes cannot leave no room for other
//! connections. It is bounded, and a full table takes nothing new (what
//! it would have forgotten instead depends on nothing a replay could
//! reproduce).

use std::collections::HashMap;

const NS: u64 = 1_000_000_000;

/// How long an echo waits for the client's first ACK. A client answers a
/// SYN-ACK at once; one that has not after RFC 6298's initial RTO of a
/// second, several times over, never will for this SYN-ACK.
pub const WAIT_NS: u64 = 10 * NS;

/// How long a refused connection stays refused after the last segment
/// refused: NAPT44's transitory TCP timeout (RFC 5382 REQ-5), past a
/// server's SYN-RECEIVED (Linux gives up after about 63 s) and a client's
/// longest retransmission gap (Linux's 120 s).
pub const REFUSED_NS: u64 = 240 * NS;

/// A connection as the subscriber sees it: its own address and port, the server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Connection {
    pub client: u32,
    pub client_port: u16,
    pub server: u32,
    pub server_port: u16,
}

/// A connection whose SYN-ACK passed, waiting for the client's first ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// When its SYN-ACK passed.
    at_ns: u64,
    /// Whether the server echoed ENABLED (and natrix removed it): the first
    /// ACK takes HOST_ID_BOUCADAIR.
    pub echoed: bool,
    /// The MSS the server announced in its SYN-ACK: the most data and TCP
    /// options together a segment to it may carry (RFC 6691 section 2).
    pub mss: u16,
    /// A rule refused the first ACK: every later client segment is refused.
    pub refused: bool,
    /// The sequence numbers the SYN-ACK took (its ISN + 1, and as many
    /// more as it carried data): a first ACK acknowledges one of them, and
    /// a segment that does not (a stale or forged one) is no first ACK.
    next: u32,
    data: u16,
}

impl Waiting {
    fn lasts_ns(&self) -> u64 {
        if self.refused {
            REFUSED_NS
        } else {
            WAIT_NS
        }
    }

    fn fresh(&self, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.at_ns) < self.lasts_ns()
    }
}

pub struct Echoed {
    seen: HashMap<Connection, Waiting>,
    capacity: usize,
    /// Entries of `seen` that are refusals.
    refusals: usize,
    /// When a full table may next look for connections that waited too
    /// long: one pass over it a second at most, not one per SYN-ACK.
    next_sweep_ns: u64,
}

impl Echoed {
    pub fn new(capacity: usize) -> Echoed {
        Echoed { seen: HashMap::new(), capacity: capacity.max(2), refusals: 0, next_sweep_ns: 0 }
    }

    /// Remembers that `c`'s SYN-ACK passed at `now_ns` (`syn_ack` its
    /// sequence number and data length) announcing `mss`, its server having
    /// `echoed` ENABLED or not (a retransmitted SYN-ACK keeps an echo seen
    /// before, the smaller MSS, and a refusal); false when the table is full
    /// even of connections still waiting.
    pub fn remember(&mut self, c: Connection, now_ns: u64, echoed: bool, mss: u16, syn_ack: (u32, u16)) -> bool {
        if !self.room_for(&c, now_ns) {
            return false;
        }
        let (next, data) = (syn_ack.0.wrapping_add(1), syn_ack.1);
        let w = self.seen.entry(c).or_insert(Waiting { at_ns: now_ns, echoed, mss, refused: false, next, data });
        // A refusal past its time is over, not renewed by the SYN-ACK.
        let refused = w.refused && w.fresh(now_ns);
        let lapsed = w.refused && !refused;
        *w = Waiting { at_ns: now_ns, echoed: echoed || w.echoed, mss: mss.min(w.mss), refused, next, data };
        self.refusals -= usize::from(lapsed);
        true
    }

    /// A rule refused `c`'s first ACK at `now_ns`: its later client
    /// segments are refused too. False when refusals hold half the table
    /// already: the connection's later segments then pass.
    pub fn refuse(&mut self, c: Connection, now_ns: u64) -> bool {
        if self.refusals * 2 >= self.capacity {
            self.sweep(now_ns);
        }
        if self.refusals * 2 >= self.capacity || !self.room_for(&c, now_ns) {
            return false;
        }
        let before = self.seen.insert(c, Waiting { at_ns: now_ns, echoed: false, mss: 0, refused: true, next: 0, data: 0 });
        if !before.is_some_and(|w| w.refused) {
            self.refusals += 1;
        }
        true
    }

    /// Whether `c` has, or can be given, an entry: a full table looks for
    /// stale entries once a second at most, not once per SYN-ACK.
    fn room_for(&mut self, c: &Connection, now_ns: u64) -> bool {
        if self.seen.len() < self.capacity || self.seen.contains_key(c) {
            return true;
        }
        self.sweep(now_ns);
        self.seen.len() < self.capacity
    }

    /// Forgets the connections that waited too long, once a second at most.
    fn sweep(&mut self, now_ns: u64) {
        if now_ns < self.next_sweep_ns {
            return;
        }
        self.next_sweep_ns = now_ns + NS;
        self.seen.retain(|_, w| w.fresh(now_ns));
        self.count_refusals();
    }

    fn count_refusals(&mut self) {
        self.refusals = self.seen.values().filter(|w| w.refused).count();
    }

    fn remove(&mut self, c: &Connection) -> Option<Waiting> {
        let w = self.seen.remove(c)?;
        self.refusals -= usize::from(w.refused);
        Some(w)
    }

    /// `c`'s client's ACK, acknowledging `ack`: the SYN-ACK it is the first
    /// answer to, if one passed recently enough (forgotten, so later ACKs
    /// find nothing), or the refusal its connection is under (kept, and
    /// its time renewed).
    pub fn take(&mut self, c: &Connection, now_ns: u64, ack: u32) -> Option<Waiting> {
        let w = self.seen.get_mut(c)?;
        if w.refused && w.fresh(now_ns) {
            w.at_ns = now_ns;
            return Some(*w);
        }
        if !w.refused && ack.wrapping_sub(w.next) > u32::from(w.data) {
            return None;
        }
        self.remove(c).filter(|w| !w.refused && w.fresh(now_ns))
    }

    /// The client opened `c` again: a refusal of the connection before goes.
    pub fn forget_refusal(&mut self, c: &Connection) {
        if self.seen.get(c).is_some_and(|w| w.refused) {
            self.remove(c);
        }
    }

    /// The rules changed: no connection stays refused by the old ones
    /// (seed 000 section 8.5: once the rules are flushed, connections are
    /// established normally).
    pub fn lift_refusals(&mut self) {
        self.seen.retain(|_, w| !w.refused);
        self.refusals = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    pub fn memory_bytes(&self) -> usize {
        self.seen.capacity() * (std::mem::size_of::<(Connection, Waiting)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SYN-ACK with ISN 99 and no data; the first ACK acknowledges 100.
    const SA: (u32, u16) = (99, 0);
    const ACK: u32 = 100;

    fn conn(port: u16) -> Connection {
        Connection { client: 1, client_port: port, server: 2, server_port: 80 }
    }

    fn echoed(w: Option<Waiting>) -> Option<bool> {
        w.map(|w| w.echoed)
    }

    #[test]
    fn a_syn_ack_is_taken_once_and_only_while_fresh() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0, true, 536, SA));
        assert_eq!(echoed(e.take(&conn(2), 1, ACK)), None, "another connection's SYN-ACK never passed");
        assert_eq!(echoed(e.take(&conn(1), 1, ACK)), Some(true));
        assert_eq!(echoed(e.take(&conn(1), 2, ACK)), None, "the first ACK takes it; later ACKs do not");
        assert!(e.remember(conn(3), 0, false, 536, SA));
        assert_eq!(echoed(e.take(&conn(3), WAIT_NS, ACK)), None, "a client that never answered");
    }

    #[test]
    fn a_retransmitted_syn_ack_keeps_the_echo_and_the_smaller_mss() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0, true, 1000, SA) && e.remember(conn(1), 1, false, 1460, SA));
        let w = e.take(&conn(1), 2, ACK).unwrap();
        assert_eq!((w.echoed, w.mss), (true, 1000));
    }

    #[test]
    fn a_refusal_holds_for_every_later_segment_each_renewing_it_until_a_new_syn_silence_or_new_rules() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0, false, 536, SA));
        assert!(!e.take(&conn(1), 1, ACK).unwrap().refused, "the first ACK, judged");
        assert!(e.refuse(conn(1), 1));
        assert!(e.remember(conn(1), 2, false, 536, SA), "a retransmitted SYN-ACK keeps it");
        assert!(e.remember(conn(9), 0, false, 536, SA) && e.take(&conn(9), 1, ACK).is_some() && e.refuse(conn(9), 1));
        assert!(e.remember(conn(9), REFUSED_NS + 1, false, 536, SA), "a SYN-ACK after the refusal lapsed");
        assert!(e.take(&conn(9), REFUSED_NS + 2, ACK).is_some_and(|w| !w.refused), "it does not revive it");
        for t in [REFUSED_NS, 2 * REFUSED_NS - 1, 3 * REFUSED_NS - 2] {
            assert!(e.take(&conn(1), t, 7).is_some_and(|w| w.refused), "refused at {t}: each refused segment renews it");
        }
        assert_eq!(e.take(&conn(1), 4 * REFUSED_NS, 7), None, "silent for REFUSED_NS: gone");
        assert!(e.refuse(conn(2), 0));
        e.forget_refusal(&conn(2));
        assert_eq!(e.take(&conn(2), 1, ACK), None, "the client opened it again");
        assert!(e.refuse(conn(3), 0));
        assert!(e.remember(conn(4), 0, true, 536, SA));
        e.lift_refusals();
        assert_eq!(e.take(&conn(3), 1, ACK), None, "new rules lift refusals");
        assert!(e.take(&conn(4), 1, ACK).is_some(), "and keep connections waiting");
    }

    #[test]
    fn only_an_ack_of_the_syn_ack_is_its_first_ack() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0, true, 536, (99, 10)));
        assert_eq!(e.take(&conn(1), 1, 99), None, "acknowledges nothing the SYN-ACK sent: stale or forged");
        assert_eq!(e.take(&conn(1), 1, 111), None, "past the SYN-ACK's data");
        assert!(e.take(&conn(1), 1, 110).is_some(), "the SYN-ACK and its 10 bytes");
        e.forget_refusal(&conn(1));
        assert!(e.remember(conn(2), 0, true, 536, (u32::MAX, 0)));
        e.forget_refusal(&conn(2));
        assert!(e.take(&conn(2), 1, 0).is_some(), "across the wrap; a new SYN does not forget one waiting");
    }

    #[test]
    fn refusals_take_half_the_table_at_most_and_a_full_table_takes_nothing_new() {
        let mut e = Echoed::new(4);
        assert!(e.refuse(conn(1), 0) && e.refuse(conn(2), 0));
        assert!(!e.refuse(conn(3), 0), "half the table refused: no more");
        assert!(e.remember(conn(4), 0, true, 536, SA) && e.remember(conn(5), 0, true, 536, SA), "the other half stays for connections waiting");
        assert!(!e.remember(conn(6), 1, true, 536, SA), "full: nothing new");
        assert!(e.take(&conn(4), 1, ACK).is_some() && e.take(&conn(1), 1, ACK).is_some_and(|w| w.refused), "nothing given up");
        e.forget_refusal(&conn(1));
        assert!(e.refuse(conn(3), 2), "a refusal gone makes room for another");
    }

    /// Stale entries are looked for once a second at most: a flood that
    /// finds the table full costs a lookup each, not a pass.
    #[test]
    fn a_full_table_makes_room_from_stale_entries_at_most_once_a_second() {
        let mut e = Echoed::new(2);
        assert!(e.refuse(conn(1), 0));
        assert!(e.remember(conn(2), 0, true, 536, SA));
        assert!(!e.remember(conn(3), WAIT_NS - 1, true, 536, SA), "swept, nothing stale yet");
        assert!(!e.remember(conn(3), WAIT_NS + 1, true, 536, SA), "stale now, but swept under a second ago");
        assert!(e.remember(conn(3), WAIT_NS - 1 + NS, true, 536, SA), "the next sweep makes room");
        assert!(e.take(&conn(1), WAIT_NS + NS, ACK).is_some_and(|w| w.refused), "a refusal lasts longer");
    }
}
