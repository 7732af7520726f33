//! ACK mode's memory (seed 000 section 3.2.2, figure 6): the connections
//! whose server echoed HOST_ID_ENABLED in its SYN-ACK, until the client's
//! first ACK takes HOST_ID_BOUCADAIR; with `[[host_id.rule]]`s, the
//! connections whose SYN-ACK passed, until its first ACK, the one segment
//! after the SYN the rules inspect; and the connections a rule refused at
//! that first ACK, whose later client segments are refused too (as a
//! dropped SYN denies a connection), until the client resets or starts
//! again, or falls silent for `REFUSED_NS`. A side table, so sessions that
//! never use it cost nothing: it holds only connections between a SYN-ACK
//! and the first ACK, and refused ones, and is bounded.

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
    /// When a full table may next look for connections that waited too
    /// long: one pass over it a second at most, not one per SYN-ACK.
    next_sweep_ns: u64,
}

impl Echoed {
    pub fn new(capacity: usize) -> Echoed {
        Echoed { seen: HashMap::new(), capacity: capacity.max(1), next_sweep_ns: 0 }
    }

    /// Remembers that `c`'s SYN-ACK passed at `now_ns` announcing `mss`,
    /// its server having `echoed` ENABLED or not (a retransmitted SYN-ACK
    /// keeps an echo seen before, the smaller MSS, and a refusal); false
    /// when the table is full even of connections still waiting.
    pub fn remember(&mut self, c: Connection, now_ns: u64, echoed: bool, mss: u16) -> bool {
        if !self.room_for(&c, now_ns) {
            return false;
        }
        let w = self.seen.entry(c).or_insert(Waiting { at_ns: now_ns, echoed, mss, refused: false });
        *w = Waiting { at_ns: now_ns, echoed: echoed || w.echoed, mss: mss.min(w.mss), refused: w.refused };
        true
    }

    /// A rule refused `c`'s first ACK at `now_ns`: its later client
    /// segments are refused too. False when the table is full.
    pub fn refuse(&mut self, c: Connection, now_ns: u64) -> bool {
        if !self.room_for(&c, now_ns) {
            return false;
        }
        let w = self.seen.entry(c).or_insert(Waiting { at_ns: now_ns, echoed: false, mss: 0, refused: true });
        (w.at_ns, w.refused) = (now_ns, true);
        true
    }

    /// Whether `c` has, or can be given, an entry: a full table looks for
    /// stale entries once a second at most, not once per SYN-ACK.
    fn room_for(&mut self, c: &Connection, now_ns: u64) -> bool {
        if self.seen.len() < self.capacity || self.seen.contains_key(c) {
            return true;
        }
        if now_ns >= self.next_sweep_ns {
            self.next_sweep_ns = now_ns + NS;
            self.seen.retain(|_, w| w.fresh(now_ns));
        }
        self.seen.len() < self.capacity
    }

    /// `c`'s client's ACK: the SYN-ACK it is the first answer to, if one
    /// passed recently enough (forgotten, so later ACKs find nothing), or
    /// the refusal its connection is under (kept, and its time renewed).
    pub fn take(&mut self, c: &Connection, now_ns: u64) -> Option<Waiting> {
        let w = self.seen.get_mut(c)?;
        if w.refused && w.fresh(now_ns) {
            w.at_ns = now_ns;
            return Some(*w);
        }
        self.seen.remove(c).filter(|w| !w.refused && w.fresh(now_ns))
    }

    /// The client reset `c`, or opened it again: whatever was remembered goes.
    pub fn forget(&mut self, c: &Connection) {
        self.seen.remove(c);
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

    fn conn(port: u16) -> Connection {
        Connection { client: 1, client_port: port, server: 2, server_port: 80 }
    }

    fn echoed(w: Option<Waiting>) -> Option<bool> {
        w.map(|w| w.echoed)
    }

    #[test]
    fn a_syn_ack_is_taken_once_and_only_while_fresh() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0, true, 536));
        assert_eq!(echoed(e.take(&conn(2), 1)), None, "another connection's SYN-ACK never passed");
        assert_eq!(echoed(e.take(&conn(1), 1)), Some(true));
        assert_eq!(echoed(e.take(&conn(1), 2)), None, "the first ACK takes it; later ACKs do not");
        assert!(e.remember(conn(3), 0, false, 536));
        assert_eq!(echoed(e.take(&conn(3), WAIT_NS)), None, "a client that never answered");
    }

    #[test]
    fn a_retransmitted_syn_ack_keeps_the_echo_and_the_smaller_mss() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0, true, 1000) && e.remember(conn(1), 1, false, 1460));
        let w = e.take(&conn(1), 2).unwrap();
        assert_eq!((w.echoed, w.mss), (true, 1000));
    }

    #[test]
    fn a_refusal_holds_for_every_later_segment_until_forgotten_or_silent() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0, false, 536));
        assert!(!e.take(&conn(1), 1).unwrap().refused, "the first ACK, judged");
        assert!(e.refuse(conn(1), 1));
        assert!(e.remember(conn(1), 2, false, 536), "a retransmitted SYN-ACK");
        for t in [3, WAIT_NS + 3, REFUSED_NS] {
            assert!(e.take(&conn(1), t).is_some_and(|w| w.refused), "refused at {t}: each refused segment renews it");
        }
        assert_eq!(e.take(&conn(1), 2 * REFUSED_NS + 1), None, "silent for REFUSED_NS: gone");
        assert!(e.refuse(conn(2), 0));
        e.forget(&conn(2));
        assert_eq!(e.take(&conn(2), 1), None, "the client reset it");
    }

    #[test]
    fn the_table_is_bounded_and_makes_room_from_stale_entries() {
        let mut e = Echoed::new(2);
        assert!(e.remember(conn(1), 0, true, 536) && e.remember(conn(2), 0, false, 536));
        assert!(!e.remember(conn(3), 1, true, 536), "full of fresh entries");
        assert!(e.remember(conn(3), WAIT_NS + 1, true, 536), "stale ones make room");
        assert_eq!(echoed(e.take(&conn(3), WAIT_NS + 2)), Some(true));
    }

    /// A full table looks for stale entries once a second at most: a flood
    /// of SYN-ACKs that finds it full costs a lookup each, not a pass.
    #[test]
    fn a_full_table_is_swept_at_most_once_a_second() {
        let mut e = Echoed::new(2);
        assert!(e.remember(conn(1), 0, true, 536) && e.remember(conn(2), 0, false, 536));
        assert!(!e.remember(conn(3), WAIT_NS - 1, true, 536), "swept, nothing stale yet");
        assert!(!e.remember(conn(3), WAIT_NS + 1, true, 536), "stale now, but swept under a second ago");
        assert!(e.remember(conn(3), WAIT_NS - 1 + NS, true, 536), "the next sweep makes room");
    }
}
