//! How the work splits across workers, each owning one engine: a subscriber
//! belongs to one worker (chosen by a hash of its address), and each worker
//! allocates external ports from its own slice of the port range (seed 004,
//! section 2.2.4). So a packet's owner is known from the packet alone:
//! outbound by source address, inbound by destination port, except for
//! operator-chosen external ports (static mappings), which are looked up.
//! In deterministic mode (RFC 7422) a subscriber's whole port range belongs
//! to the subscriber's worker, whatever slice it falls in: the formula says
//! whose it is.
//! The dataplane steers with these functions and each engine checks
//! ownership with the same ones, so the two cannot disagree.

use std::net::Ipv6Addr;

use crate::config::{EngineConfig, StaticMapping};
use crate::state::deterministic::{Deterministic, Member};
use crate::Proto;

/// Which worker an engine is, out of how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u16,
    pub count: u16,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { index: 0, count: 1 }
    }
}

/// A fixed mixing constant: the owner of a subscriber must not change with
/// the engine's random seed, or a restart would move subscribers.
const SUBSCRIBER_MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// The worker that owns a subscriber's state.
pub fn worker_of_subscriber(addr: u32, count: u16) -> u16 {
    if count <= 1 {
        return 0;
    }
    let h = (u64::from(addr).wrapping_mul(SUBSCRIBER_MIX)) >> 32;
    (h % u64::from(count)) as u16
}

/// The worker of an IPv6 host (a DS-Lite B4): its address folded to 32
/// bits, then spread as subscribers' addresses are.
pub fn worker_of_host6(addr: Ipv6Addr, count: u16) -> u16 {
    let a = u128::from(addr);
    let folded = (a ^ (a >> 32) ^ (a >> 64) ^ (a >> 96)) as u32;
    worker_of_subscriber(folded, count)
}

/// The worker that owns a deterministic-mode subscriber: where its
/// packets are steered, by its IPv4 address or its B4's.
pub fn worker_of_member(m: Member, count: u16) -> u16 {
    match m {
        Member::Ipv4(a) => worker_of_subscriber(a, count),
        Member::B4(b4) => worker_of_host6(b4, count),
    }
}

/// The part of `ports` that worker `index` allocates from. Slices start on
/// multiples of `align` (the block size, and at least 2 so parity holds) and
/// the last one takes the remainder.
pub fn port_slice(ports: (u16, u16), align: u16, shard: Shard) -> (u16, u16) {
    if shard.count <= 1 {
        return ports;
    }
    let (lo, hi) = (u32::from(ports.0), u32::from(ports.1));
    let align = u32::from(align.max(2));
    let span = hi - lo + 1;
    let per = (span / u32::from(shard.count)) / align * align;
    let first = lo + per * u32::from(shard.index);
    let last = if shard.index + 1 == shard.count { hi } else { first + per - 1 };
    (first as u16, last as u16)
}

/// Whose is an external (address, port): the worker it must be steered to.
#[derive(Debug, Clone)]
pub struct Owners {
    ports: (u16, u16),
    align: u16,
    count: u16,
    /// Static mappings' external endpoints and their owners, sorted: looked
    /// up by binary search for every inbound frame while steering.
    statics: Vec<((Proto, u32, u16), u16)>,
    deterministic: Option<Deterministic>,
}

impl Owners {
    pub fn new(ports: (u16, u16), align: u16, count: u16, statics: &[StaticMapping]) -> Owners {
        let mut statics: Vec<_> = statics.iter().map(|s| ((s.proto, s.ext_addr, s.ext_port), worker_of_subscriber(s.int_addr, count))).collect();
        statics.sort_unstable();
        Owners { ports, align, count, statics, deterministic: None }
    }

    /// Steers the ranges of deterministic mode to their subscribers' workers.
    pub fn with_deterministic(mut self, d: Option<Deterministic>) -> Owners {
        self.deterministic = d;
        self
    }

    /// The owners of everything `cfg` maps, for `count` workers: port
    /// slices, static mappings and deterministic ranges.
    pub fn for_config(cfg: &EngineConfig, count: u16) -> Owners {
        Owners::new(cfg.ports, cfg.port_block_size, count, &cfg.statics).with_deterministic(cfg.deterministic.clone())
    }

    pub fn count(&self) -> u16 {
        self.count
    }

    pub fn of_external(&self, proto: Proto, addr: u32, port: u16) -> u16 {
        if self.count <= 1 {
            return 0;
        }
        if let Ok(i) = self.statics.binary_search_by_key(&(proto, addr, port), |&(k, _)| k) {
            return self.statics[i].1;
        }
        if let Some(a) = self.deterministic.as_ref().and_then(|d| d.owner(addr, port)) {
            return worker_of_member(a.subscriber, self.count);
        }
        self.of_port(port)
    }

    fn of_port(&self, port: u16) -> u16 {
        let per = u32::from(port_slice(self.ports, self.align, Shard { index: 0, count: self.count }).1 - self.ports.0) + 1;
        let off = u32::from(port.saturating_sub(self.ports.0));
        ((off / per) as u16).min(self.count - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_range_without_overlap() {
        for count in 1..=7u16 {
            let mut next = 1024u32;
            for index in 0..count {
                let (a, b) = port_slice((1024, 65535), 64, Shard { index, count });
                assert_eq!(u32::from(a), next, "count {count} index {index}");
                assert!(b >= a);
                if count > 1 {
                    assert_eq!((a - 1024) % 64, 0, "block aligned");
                }
                next = u32::from(b) + 1;
            }
            assert_eq!(next, 65536);
        }
    }

    #[test]
    fn every_port_is_owned_by_the_worker_whose_slice_holds_it() {
        for count in [2u16, 3, 4] {
            let owners = Owners::new((1024, 65535), 2, count, &[]);
            for index in 0..count {
                let (a, b) = port_slice((1024, 65535), 2, Shard { index, count });
                for p in [a, a + 1, (a / 2 + b / 2), b] {
                    assert_eq!(owners.of_external(Proto::Udp, 1, p), index, "port {p}");
                }
            }
        }
    }

    #[test]
    fn a_static_mapping_is_owned_by_its_subscribers_worker() {
        let st = StaticMapping { proto: Proto::Tcp, int_addr: 0x6440_0005, int_port: 80, ext_addr: 0xcb00_7101, ext_port: 8080 };
        let owners = Owners::new((1024, 65535), 2, 4, &[st]);
        assert_eq!(owners.of_external(Proto::Tcp, st.ext_addr, 8080), worker_of_subscriber(st.int_addr, 4));
    }

    #[test]
    fn subscribers_spread_over_workers() {
        let mut seen = [0u32; 4];
        for a in 0..4000u32 {
            seen[usize::from(worker_of_subscriber(0x6440_0000 + a, 4))] += 1;
        }
        assert!(seen.iter().all(|&n| n > 700), "{seen:?}");
    }
}
