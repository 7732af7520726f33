//! ACK mode's memory (seed 000 section 3.2.2, figure 6): the connections
//! whose server echoed HOST_ID_ENABLED in its SYN-ACK, until the client's
//! first ACK takes HOST_ID_BOUCADAIR. A side table, so sessions that never
//! use it cost nothing: it holds only connections between a SYN-ACK and the
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

pub struct Echoed {
    /// When each connection's echo was seen.
    seen: HashMap<Connection, u64>,
    capacity: usize,
}

impl Echoed {
    pub fn new(capacity: usize) -> Echoed {
        Echoed { seen: HashMap::new(), capacity: capacity.max(1) }
    }

    /// Remembers that `c`'s server echoed ENABLED at `now_ns`; false when
    /// the table is full even of echoes still waiting.
    pub fn remember(&mut self, c: Connection, now_ns: u64) -> bool {
        if self.seen.len() >= self.capacity && !self.seen.contains_key(&c) {
            self.seen.retain(|_, &mut at| now_ns.saturating_sub(at) < WAIT_NS);
            if self.seen.len() >= self.capacity {
                return false;
            }
        }
        self.seen.insert(c, now_ns);
        true
    }

    /// Whether `c`'s server echoed ENABLED (recently enough); forgets it.
    pub fn take(&mut self, c: &Connection, now_ns: u64) -> bool {
        self.seen.remove(c).is_some_and(|at| now_ns.saturating_sub(at) < WAIT_NS)
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    pub fn memory_bytes(&self) -> usize {
        self.seen.capacity() * (std::mem::size_of::<(Connection, u64)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(port: u16) -> Connection {
        Connection { client: 1, client_port: port, server: 2, server_port: 80 }
    }

    #[test]
    fn an_echo_is_taken_once_and_only_while_fresh() {
        let mut e = Echoed::new(4);
        assert!(e.remember(conn(1), 0));
        assert!(!e.take(&conn(2), 1), "another connection never echoed");
        assert!(e.take(&conn(1), 1));
        assert!(!e.take(&conn(1), 2), "the first ACK takes it; later ACKs do not");
        assert!(e.remember(conn(3), 0));
        assert!(!e.take(&conn(3), WAIT_NS), "a client that never answered");
    }

    #[test]
    fn the_table_is_bounded_and_makes_room_from_stale_echoes() {
        let mut e = Echoed::new(2);
        assert!(e.remember(conn(1), 0) && e.remember(conn(2), 0));
        assert!(!e.remember(conn(3), 1), "full of fresh echoes");
        assert!(e.remember(conn(3), WAIT_NS + 1), "stale ones make room");
        assert!(e.take(&conn(3), WAIT_NS + 2));
    }
}
