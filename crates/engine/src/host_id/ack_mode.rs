//! ACK mode's memory (seed 000 section 3.2.2, figure 6): the connections
//! whose server echoed HOST_ID_ENABLED in its SYN-ACK, until the client's
//! first ACK takes HOST_ID_BOUCADAIR; with `[[host_id.rule]]`s, every
//! connection whose SYN-ACK passed, until its first ACK, the one segment
//! after the SYN the rules inspect. A side table, so sessions that never use
//! it cost nothing: it holds only connections between a SYN-ACK and the
//! first ACK, and is bounded.

use std::collections::HashMap;

const NS: u64 = 1_000_000_000;

/// How long an echo waits for the client's first ACK. A client answers a
/// SYN-ACK at once; one that has not after RFC 6298's initial RTO of a
/// second, several times over, never will for this SYN-ACK.
pub const WAIT_NS: u64 = 10 * NS;

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
    /// keeps an echo seen before); false when the table is full even of
    /// connections still waiting.
    pub fn remember(&mut self, c: Connection, now_ns: u64, echoed: bool, mss: u16) -> bool {
        if self.seen.len() >= self.capacity && !self.seen.contains_key(&c) {
            if now_ns >= self.next_sweep_ns {
                self.next_sweep_ns = now_ns + NS;
                self.seen.retain(|_, w| now_ns.saturating_sub(w.at_ns) < WAIT_NS);
            }
            if self.seen.len() >= self.capacity {
                return false;
            }
        }
        let w = self.seen.entry(c).or_insert(Waiting { at_ns: now_ns, echoed, mss });
        *w = Waiting { at_ns: now_ns, echoed: echoed || w.echoed, mss };
        true
    }

    /// `c`'s client's first ACK: the SYN-ACK it answers, if one passed
    /// recently enough; forgets it, so later ACKs find nothing.
    pub fn take(&mut self, c: &Connection, now_ns: u64) -> Option<Waiting> {
        self.seen.remove(c).filter(|w| now_ns.saturating_sub(w.at_ns) < WAIT_NS)
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
    fn a_retransmitted_syn_ack_keeps_the_echo() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0, true, 536) && e.remember(conn(1), 1, false, 536));
        assert_eq!(echoed(e.take(&conn(1), 2)), Some(true));
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
