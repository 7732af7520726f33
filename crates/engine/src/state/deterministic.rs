//! Deterministic NAT (RFC 7422): every subscriber gets a fixed external
//! address and port range computed from its inside address, so the
//! configuration itself is the log and no per-mapping record is needed.
//!
//! The formula. Number the subscribers by counting addresses through the
//! `subscribers` prefixes in the order they are configured: the first
//! address of the first prefix is subscriber 0. With the pool addresses in
//! ascending order, the port range `lo..=hi` and `N` ports per subscriber:
//!
//! ```text
//! per_address = (hi - lo + 1) / N          ranges on each pool address
//! address     = pool[i / per_address]
//! k           = i % per_address
//! ports       = lo + k*N ..= lo + (k+1)*N - 1
//! ```
//!
//! and backward, for an external `address:port` with `port` in `lo..=hi`:
//!
//! ```text
//! i = index_in_pool(address) * per_address + (port - lo) / N
//! ```
//!
//! (a port past the last whole range, or an `i` past the last subscriber,
//! belongs to nobody). The same range applies to TCP, UDP and ICMP query
//! identifiers.

use crate::config::prefix_contains;

/// `[nat] mode = "deterministic"` as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeterministicConfig {
    /// Inside prefixes (network, length), numbered in this order.
    pub subscribers: Vec<(u32, u8)>,
    pub ports_per_subscriber: u16,
}

/// Why a deterministic configuration does not work: the `[nat]` key at
/// fault (`subscribers`, `subscribers[2]`, `ports_per_subscriber`) and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeterministicError {
    pub key: String,
    pub problem: String,
}

/// One subscriber's place in the formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// The subscriber's number, counted through the prefixes.
    pub index: u64,
    pub subscriber: u32,
    pub ext_addr: u32,
    pub first: u16,
    pub last: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Prefix {
    network: u32,
    len: u8,
    /// Number of the prefix's first address.
    first_index: u64,
}

impl Prefix {
    fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.len))
    }
}

/// The formula, ready to be evaluated both ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deterministic {
    /// In configured order.
    prefixes: Vec<Prefix>,
    /// Indexes into `prefixes`, sorted by network, for lookups by address.
    by_network: Vec<usize>,
    pool: Vec<u32>,
    lo: u16,
    per_subscriber: u16,
    per_address: u32,
    subscribers: u64,
}

fn last_of(network: u32, len: u8) -> u32 {
    network | if len == 0 { u32::MAX } else { ((1u64 << (32 - u32::from(len))) - 1) as u32 }
}

impl Deterministic {
    /// Checks the arithmetic and builds the formula. `pool` is sorted and
    /// unique (as in `EngineConfig`), `ports` the external port range.
    pub fn new(cfg: &DeterministicConfig, pool: &[u32], ports: (u16, u16)) -> Result<Deterministic, DeterministicError> {
        let fail = |key: &str, problem: String| Err(DeterministicError { key: key.to_owned(), problem });
        if cfg.subscribers.is_empty() {
            return fail("subscribers", "deterministic mode needs the inside prefixes, e.g. subscribers = [\"100.64.0.0/22\"]".into());
        }
        let range = u32::from(ports.1 - ports.0) + 1;
        let n = u32::from(cfg.ports_per_subscriber);
        if n == 0 || n > range {
            return fail("ports_per_subscriber", format!("{n} does not fit: nat.ports {}-{} holds {range} ports", ports.0, ports.1));
        }
        let mut prefixes = Vec::with_capacity(cfg.subscribers.len());
        let mut next = 0u64;
        for &(network, len) in &cfg.subscribers {
            let p = Prefix { network, len, first_index: next };
            next += p.size();
            prefixes.push(p);
        }
        let mut by_network: Vec<usize> = (0..prefixes.len()).collect();
        by_network.sort_by_key(|&i| prefixes[i].network);
        for w in by_network.windows(2) {
            let (a, b) = (&prefixes[w[0]], &prefixes[w[1]]);
            if last_of(a.network, a.len) >= b.network {
                let (first, second) = (w[0].min(w[1]), w[0].max(w[1]));
                return fail(&format!("subscribers[{second}]"), format!("overlaps nat.subscribers[{first}]: each inside address must have one number"));
            }
        }
        for (i, p) in prefixes.iter().enumerate() {
            let last = last_of(p.network, p.len);
            if let Some(a) = pool.iter().find(|&&a| a >= p.network && a <= last) {
                return fail(&format!("subscribers[{i}]"), format!("contains pool address {}", std::net::Ipv4Addr::from(*a)));
            }
        }
        let per_address = range / n;
        let capacity = pool.len() as u64 * u64::from(per_address);
        let subscribers = next;
        if subscribers > capacity {
            let need_addrs = subscribers.div_ceil(u64::from(per_address));
            let per_addr_needed = subscribers.div_ceil(pool.len().max(1) as u64);
            let hint = match u64::from(range) / per_addr_needed {
                0 => String::new(),
                m => format!(", or ports_per_subscriber = {m} or less"),
            };
            return fail(
                "subscribers",
                format!(
                    "{subscribers} subscribers do not fit: with ports {}-{} ({range} ports, {per_address} ranges of {n} per address) \
                     the pool's {} address(es) can hold {capacity} subscribers; {subscribers} subscribers need {need_addrs} pool addresses{hint}",
                    ports.0,
                    ports.1,
                    pool.len(),
                ),
            );
        }
        Ok(Deterministic { prefixes, by_network, pool: pool.to_vec(), lo: ports.0, per_subscriber: cfg.ports_per_subscriber, per_address, subscribers })
    }

    /// How many subscribers the configured prefixes hold.
    /// The inside prefixes (network, length), in the formula's order.
    pub fn prefixes(&self) -> impl Iterator<Item = (u32, u8)> + '_ {
        self.prefixes.iter().map(|p| (p.network, p.len))
    }

    pub fn subscriber_count(&self) -> u64 {
        self.subscribers
    }

    /// How many subscribers the pool could hold with these numbers.
    pub fn capacity(&self) -> u64 {
        self.pool.len() as u64 * u64::from(self.per_address)
    }

    pub fn ports_per_subscriber(&self) -> u16 {
        self.per_subscriber
    }

    /// Port ranges on each pool address.
    pub fn ranges_per_address(&self) -> u32 {
        self.per_address
    }

    /// The subscriber's number, or None for an address outside the prefixes.
    pub fn index_of(&self, addr: u32) -> Option<u64> {
        let at = self.by_network.partition_point(|&i| self.prefixes[i].network <= addr);
        let p = &self.prefixes[*self.by_network.get(at.checked_sub(1)?)?];
        prefix_contains(p.network, p.len, addr).then(|| p.first_index + u64::from(addr - p.network))
    }

    /// The inside address of subscriber number `index`.
    pub fn address_of(&self, index: u64) -> Option<u32> {
        if index >= self.subscribers {
            return None;
        }
        let at = self.prefixes.partition_point(|p| p.first_index <= index) - 1;
        let p = &self.prefixes[at];
        Some(p.network + (index - p.first_index) as u32)
    }

    /// Forward: the external address and port range of a subscriber.
    pub fn assignment(&self, subscriber: u32) -> Option<Assignment> {
        let index = self.index_of(subscriber)?;
        let per = u64::from(self.per_address);
        let ext_addr = *self.pool.get((index / per) as usize)?;
        let k = (index % per) as u32;
        let n = u32::from(self.per_subscriber);
        let first = u32::from(self.lo) + k * n;
        Some(Assignment { index, subscriber, ext_addr, first: first as u16, last: (first + n - 1) as u16 })
    }

    /// Backward: who holds an external address and port, with its range.
    pub fn owner(&self, ext_addr: u32, port: u16) -> Option<Assignment> {
        let a = self.pool.binary_search(&ext_addr).ok()? as u64;
        let off = u32::from(port.checked_sub(self.lo)?);
        let k = off / u32::from(self.per_subscriber);
        if k >= self.per_address {
            return None;
        }
        let index = a * u64::from(self.per_address) + u64::from(k);
        let subscriber = self.address_of(index)?;
        let first = u32::from(self.lo) + k * u32::from(self.per_subscriber);
        Some(Assignment { index, subscriber, ext_addr, first: first as u16, last: (first + u32::from(self.per_subscriber) - 1) as u16 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;
    use crate::state::events::EventKind;
    use crate::state::shard::{worker_of_subscriber, Owners};
    use crate::{DropReason, Engine, Proto, Side, Verdict};

    const fn ip(a: [u8; 4]) -> u32 {
        u32::from_be_bytes(a)
    }

    const POOL: [u32; 2] = [ip([203, 0, 113, 1]), ip([203, 0, 113, 2])];

    fn det_cfg(prefixes: &[(u32, u8)], n: u16) -> DeterministicConfig {
        DeterministicConfig { subscribers: prefixes.to_vec(), ports_per_subscriber: n }
    }

    /// 100.64.0.0/24 then 10.0.0.0/25 (384 subscribers) on 2 addresses of
    /// 1024-65535: 64512 / 336 = 192 ranges per address, exactly full.
    fn small() -> Deterministic {
        Deterministic::new(&det_cfg(&[(ip([100, 64, 0, 0]), 24), (ip([10, 0, 0, 0]), 25)], 336), &POOL, (1024, 65535)).unwrap()
    }

    #[test]
    fn forward_follows_the_documented_formula() {
        let d = small();
        assert_eq!(d.ranges_per_address(), 192);
        assert_eq!(d.subscriber_count(), 384);
        assert_eq!(d.capacity(), 384);
        let a = d.assignment(ip([100, 64, 0, 0])).unwrap();
        assert_eq!((a.index, a.ext_addr, a.first, a.last), (0, POOL[0], 1024, 1024 + 335));
        let a = d.assignment(ip([100, 64, 0, 5])).unwrap();
        assert_eq!((a.index, a.ext_addr, a.first, a.last), (5, POOL[0], 1024 + 5 * 336, 1024 + 6 * 336 - 1));
        // Subscriber 192 is the first on the second pool address.
        let a = d.assignment(ip([100, 64, 0, 192])).unwrap();
        assert_eq!((a.index, a.ext_addr, a.first), (192, POOL[1], 1024));
        // The second prefix continues the numbering.
        let a = d.assignment(ip([10, 0, 0, 0])).unwrap();
        assert_eq!((a.index, a.ext_addr, a.first), (256, POOL[1], 1024 + 64 * 336));
        let a = d.assignment(ip([10, 0, 0, 127])).unwrap();
        assert_eq!((a.index, a.ext_addr, a.last), (383, POOL[1], 65535));
        assert_eq!(d.assignment(ip([10, 0, 0, 128])), None);
        assert_eq!(d.assignment(ip([100, 64, 1, 0])), None);
        assert_eq!(d.assignment(ip([9, 255, 255, 255])), None);
    }

    #[test]
    fn backward_inverts_forward_for_every_port_of_every_subscriber() {
        let d = small();
        for index in 0..d.subscriber_count() {
            let sub = d.address_of(index).unwrap();
            let a = d.assignment(sub).unwrap();
            assert_eq!(a.index, index);
            for port in [a.first, a.first + 1, (a.first / 2 + a.last / 2), a.last] {
                assert_eq!(d.owner(a.ext_addr, port), Some(a), "subscriber {index} port {port}");
            }
        }
        // Ports below the range and other addresses belong to nobody.
        assert_eq!(d.owner(POOL[0], 1023), None);
        assert_eq!(d.owner(ip([203, 0, 113, 3]), 2000), None);
    }

    #[test]
    fn unused_ranges_belong_to_nobody() {
        let d = Deterministic::new(&det_cfg(&[(ip([100, 64, 0, 0]), 30)], 1000), &POOL, (1024, 65535)).unwrap();
        assert_eq!(d.owner(POOL[0], 1024 + 3 * 1000).unwrap().subscriber, ip([100, 64, 0, 3]));
        assert_eq!(d.owner(POOL[0], 1024 + 4 * 1000), None);
        assert_eq!(d.owner(POOL[1], 1024), None);
        // 64 whole ranges of 1000 end at 65023; the remainder is nobody's.
        let d = Deterministic::new(&det_cfg(&[(ip([100, 64, 0, 0]), 25)], 1000), &POOL, (1024, 65535)).unwrap();
        assert_eq!(d.owner(POOL[0], 65023).unwrap().index, 63);
        assert_eq!(d.owner(POOL[0], 65024), None);
        assert_eq!(d.owner(POOL[1], 65535), None);
    }

    #[test]
    fn arithmetic_that_does_not_fit_is_refused_with_the_capacity() {
        // /22 = 1024 subscribers; 2 addresses x 64 ranges of 1008 = 128.
        let e = Deterministic::new(&det_cfg(&[(ip([100, 64, 0, 0]), 22)], 1008), &POOL, (1024, 65535)).unwrap_err();
        assert_eq!(e.key, "subscribers");
        assert!(e.problem.contains("can hold 128 subscribers"), "{}", e.problem);
        assert!(e.problem.contains("need 16 pool addresses"), "{}", e.problem);
        assert!(e.problem.contains("ports_per_subscriber = 126"), "{}", e.problem);
        let e = Deterministic::new(&det_cfg(&[(ip([100, 64, 0, 0]), 24)], 2000), &POOL, (1024, 2047)).unwrap_err();
        assert_eq!(e.key, "ports_per_subscriber");
        let e = Deterministic::new(&det_cfg(&[(ip([100, 64, 0, 0]), 24), (ip([100, 64, 0, 128]), 25)], 10), &POOL, (1024, 65535)).unwrap_err();
        assert_eq!(e.key, "subscribers[1]");
        let e = Deterministic::new(&det_cfg(&[(ip([203, 0, 113, 0]), 24)], 10), &POOL, (1024, 65535)).unwrap_err();
        assert!(e.problem.contains("pool address"), "{}", e.problem);
    }

    fn engine(count: u16, index: u16) -> Engine {
        let cfg = EngineConfig {
            pool: POOL.to_vec(),
            deterministic: Some(Deterministic::new(&det_cfg(&[(ip([100, 64, 0, 0]), 24)], 504), &POOL, (1024, 65535)).unwrap()),
            shard: crate::state::shard::Shard { index, count },
            max_sessions: 1024,
            max_subscribers: 1024,
            ..EngineConfig::default()
        };
        Engine::new(cfg).unwrap()
    }

    fn udp(src: u32, sport: u16) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(src.to_be_bytes(), [198, 51, 100, 7], 64).udp(sport, 53);
        let mut v = Vec::new();
        b.write(&mut v, b"q").unwrap();
        v
    }

    fn source_of(frame: &[u8]) -> (u32, u16) {
        let ip = &frame[14..];
        let l4 = usize::from(ip[0] & 15) * 4;
        (u32::from_be_bytes([ip[12], ip[13], ip[14], ip[15]]), u16::from_be_bytes([ip[l4], ip[l4 + 1]]))
    }

    #[test]
    fn the_engine_allocates_only_inside_the_subscribers_range() {
        let mut e = engine(1, 0);
        let d = e.deterministic().unwrap().clone();
        let mut now = 1_000_000_000u64;
        for sub in [ip([100, 64, 0, 2]), ip([100, 64, 0, 130]), ip([100, 64, 0, 255])] {
            let a = d.assignment(sub).unwrap();
            // Preserved when the source port is in the range; otherwise inside it, parity kept.
            let mut f = udp(sub, a.first + 10);
            assert_eq!(e.process(&mut f, Side::Inside, now), Verdict::Forward(Side::Outside));
            assert_eq!(source_of(&f), (a.ext_addr, a.first + 10));
            for sport in [40000u16, 40001, 53, 1024, 65535] {
                now += 1000;
                let mut f = udp(sub, sport);
                assert_eq!(e.process(&mut f, Side::Inside, now), Verdict::Forward(Side::Outside));
                let (addr, port) = source_of(&f);
                assert_eq!(addr, a.ext_addr);
                assert!((a.first..=a.last).contains(&port), "{port} outside {}-{}", a.first, a.last);
                assert_eq!(port & 1, sport & 1, "parity");
                assert_eq!(d.owner(addr, port).map(|o| o.subscriber), Some(sub));
            }
        }
    }

    #[test]
    fn a_full_range_is_the_subscribers_quota_and_parity_gives_way() {
        let cfg = EngineConfig {
            pool: POOL.to_vec(),
            deterministic: Some(Deterministic::new(&det_cfg(&[(ip([100, 64, 0, 0]), 24)], 4), &POOL, (1024, 65535)).unwrap()),
            max_sessions: 1024,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(cfg).unwrap();
        let sub = ip([100, 64, 0, 9]);
        let a = e.deterministic().unwrap().assignment(sub).unwrap();
        let mut got = Vec::new();
        for sport in [2000u16, 2002, 2004, 2006] {
            let mut f = udp(sub, sport);
            assert_eq!(e.process(&mut f, Side::Inside, 1_000_000_000), Verdict::Forward(Side::Outside));
            got.push(source_of(&f).1);
        }
        got.sort_unstable();
        assert_eq!(got, (a.first..=a.last).collect::<Vec<_>>());
        let mut f = udp(sub, 2008);
        assert_eq!(e.process(&mut f, Side::Inside, 1_000_000_000), Verdict::Drop(DropReason::PortQuota));
        let mut kinds = Vec::new();
        e.drain_events(|ev| kinds.push(ev.kind));
        assert!(kinds.contains(&EventKind::QuotaExceeded), "{kinds:?}");
    }

    #[test]
    fn a_source_outside_the_prefixes_is_refused_and_counted() {
        let mut e = engine(1, 0);
        let mut f = udp(ip([100, 64, 1, 1]), 40000);
        assert_eq!(e.process(&mut f, Side::Inside, 1_000_000_000), Verdict::Drop(DropReason::NotSubscriber));
        assert_eq!(e.stats().drops.get(DropReason::NotSubscriber), 1);
        assert_eq!(e.subscribers().len(), 0);
        assert_eq!(e.tables().mapping_count(), 0);
    }

    #[test]
    fn each_worker_allocates_its_subscribers_whole_range_and_owners_steer_to_it() {
        let count = 3;
        let d = engine(count, 0).deterministic().unwrap().clone();
        let owners = Owners::for_config(&engine(count, 0).config().clone(), count);
        for sub in (0..40u32).map(|i| ip([100, 64, 0, 0]) + i * 6) {
            let w = worker_of_subscriber(sub, count);
            let mut e = engine(count, w);
            let a = d.assignment(sub).unwrap();
            let mut f = udp(sub, a.last);
            assert_eq!(e.process(&mut f, Side::Inside, 1_000_000_000), Verdict::Forward(Side::Outside));
            assert_eq!(source_of(&f), (a.ext_addr, a.last));
            for port in [a.first, a.last] {
                for proto in Proto::ALL {
                    assert_eq!(owners.of_external(proto, a.ext_addr, port), w);
                }
            }
        }
    }
}
