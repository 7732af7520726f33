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
//!
//! DS-Lite (RFC 6333): a prefix may be IPv6, and then each B4 address in it
//! is one subscriber, counted like an IPv4 address in the same one
//! numbering: `["2001:db8:100::/120", "100.64.0.0/24"]` makes the 256 B4s
//! 2001:db8:100:: to 2001:db8:100::ff subscribers 0-255 and the IPv4
//! subscribers 256-511. Every host behind a B4 shares the B4's range. To
//! count both families in one line, an IPv4 address is taken as its
//! IPv4-mapped IPv6 address (::ffff:a.b.c.d), where no B4 can be.

use std::net::Ipv6Addr;

/// IPv4-mapped IPv6 addresses (RFC 4291 section 2.5.5.2): ::ffff:0:0/96.
const V4_MAPPED: u128 = 0xffff_0000_0000;

/// A subscriber of the formula: an IPv4 address, or a DS-Lite B4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Member {
    Ipv4(u32),
    B4(Ipv6Addr),
}

impl Member {
    /// The member's place on the one line both families are counted on.
    fn key(self) -> u128 {
        match self {
            Member::Ipv4(a) => V4_MAPPED | u128::from(a),
            Member::B4(b) => u128::from(b),
        }
    }
}

/// A prefix of `[nat] subscribers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriberPrefix {
    Ipv4(u32, u8),
    /// B4 addresses (only with `[dslite]`).
    B4(Ipv6Addr, u8),
}

impl SubscriberPrefix {
    /// The prefix on the line of `Member::key`: its network and its length in 128 bits.
    fn on_line(self) -> (u128, u8) {
        match self {
            SubscriberPrefix::Ipv4(n, len) => (V4_MAPPED | u128::from(n), 96 + len),
            SubscriberPrefix::B4(n, len) => (u128::from(n), len),
        }
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Member::Ipv4(a) => write!(f, "{}", std::net::Ipv4Addr::from(*a)),
            Member::B4(b4) => write!(f, "B4 {b4}"),
        }
    }
}

/// `[nat] mode = "deterministic"` as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeterministicConfig {
    /// Inside prefixes, numbered in this order.
    pub subscribers: Vec<SubscriberPrefix>,
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
    pub subscriber: Member,
    pub ext_addr: u32,
    pub first: u16,
    pub last: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Prefix {
    /// On the line of `Member::key`.
    network: u128,
    len: u8,
    b4s: bool,
    /// Number of the prefix's first address.
    first_index: u64,
}

impl Prefix {
    /// Addresses in the prefix, saturated (a /0 holds one more than u128 counts).
    fn size(&self) -> u128 {
        1u128.checked_shl(128 - u32::from(self.len)).unwrap_or(u128::MAX)
    }

    fn last(&self) -> u128 {
        self.network | u128::MAX.checked_shr(u32::from(self.len)).unwrap_or(0)
    }

    fn contains(&self, key: u128) -> bool {
        key >= self.network && key <= self.last()
    }

    fn member(&self, offset: u64) -> Member {
        let key = self.network + u128::from(offset);
        if self.b4s {
            Member::B4(Ipv6Addr::from(key))
        } else {
            Member::Ipv4(key as u32)
        }
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
        let per_address = range / n;
        let capacity = pool.len() as u64 * u64::from(per_address);
        let mut prefixes = Vec::with_capacity(cfg.subscribers.len());
        let mut next = 0u128;
        for (i, &p) in cfg.subscribers.iter().enumerate() {
            let (network, len) = p.on_line();
            let b4s = matches!(p, SubscriberPrefix::B4(..));
            let p = Prefix { network, len, b4s, first_index: next.min(u128::from(u64::MAX)) as u64 };
            if b4s && (p.contains(V4_MAPPED) || (V4_MAPPED..=V4_MAPPED | u128::from(u32::MAX)).contains(&network)) {
                return fail(&format!("subscribers[{i}]"), "an IPv4-mapped prefix (::ffff:0:0/96) holds no B4s: write IPv4 subscribers as IPv4 prefixes".into());
            }
            next = next.saturating_add(p.size());
            prefixes.push(p);
        }
        let mut by_network: Vec<usize> = (0..prefixes.len()).collect();
        by_network.sort_by_key(|&i| prefixes[i].network);
        for w in by_network.windows(2) {
            let (a, b) = (&prefixes[w[0]], &prefixes[w[1]]);
            if a.last() >= b.network {
                let (first, second) = (w[0].min(w[1]), w[0].max(w[1]));
                return fail(&format!("subscribers[{second}]"), format!("overlaps nat.subscribers[{first}]: each inside address must have one number"));
            }
        }
        for (i, p) in prefixes.iter().enumerate() {
            if let Some(a) = pool.iter().find(|&&a| p.contains(Member::Ipv4(a).key())) {
                return fail(&format!("subscribers[{i}]"), format!("contains pool address {}", std::net::Ipv4Addr::from(*a)));
            }
        }
        if next > u128::from(capacity) {
            return fail("subscribers", too_many(next, capacity, pool.len(), per_address, n, range, ports));
        }
        Ok(Deterministic { prefixes, by_network, pool: pool.to_vec(), lo: ports.0, per_subscriber: cfg.ports_per_subscriber, per_address, subscribers: next as u64 })
    }

    /// The IPv4 prefixes (network, length), in the formula's order.
    pub fn prefixes(&self) -> impl Iterator<Item = (u32, u8)> + '_ {
        self.prefixes.iter().filter(|p| !p.b4s).map(|p| (p.network as u32, p.len - 96))
    }

    /// Whether the formula numbers B4s (DS-Lite subscribers).
    pub fn numbers_b4s(&self) -> bool {
        self.prefix_kinds().any(|b4s| b4s)
    }

    /// For each prefix in configured order: whether it holds B4s.
    pub fn prefix_kinds(&self) -> impl Iterator<Item = bool> + '_ {
        self.prefixes.iter().map(|p| p.b4s)
    }

    /// How many subscribers the configured prefixes hold.
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

    /// An IPv4 subscriber's number, or None for an address outside the prefixes.
    pub fn index_of(&self, addr: u32) -> Option<u64> {
        self.index_of_member(Member::Ipv4(addr))
    }

    /// A subscriber's number, or None for one outside the prefixes (of its family).
    pub fn index_of_member(&self, m: Member) -> Option<u64> {
        let key = m.key();
        let at = self.by_network.partition_point(|&i| self.prefixes[i].network <= key);
        let p = &self.prefixes[*self.by_network.get(at.checked_sub(1)?)?];
        (p.contains(key) && p.b4s == matches!(m, Member::B4(_))).then(|| p.first_index + (key - p.network) as u64)
    }

    /// The subscriber numbered `index`.
    pub fn member_of(&self, index: u64) -> Option<Member> {
        if index >= self.subscribers {
            return None;
        }
        let at = self.prefixes.partition_point(|p| p.first_index <= index) - 1;
        let p = &self.prefixes[at];
        Some(p.member(index - p.first_index))
    }

    /// Forward: the external address and port range of an IPv4 subscriber.
    pub fn assignment(&self, subscriber: u32) -> Option<Assignment> {
        self.assignment_of(Member::Ipv4(subscriber))
    }

    /// Forward: the external address and port range of a subscriber.
    pub fn assignment_of(&self, subscriber: Member) -> Option<Assignment> {
        let index = self.index_of_member(subscriber)?;
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
        let subscriber = self.member_of(index)?;
        let first = u32::from(self.lo) + k * u32::from(self.per_subscriber);
        Some(Assignment { index, subscriber, ext_addr, first: first as u16, last: (first + u32::from(self.per_subscriber) - 1) as u16 })
    }
}

/// The refusal when the prefixes hold more subscribers than the pool:
/// what the pool can hold, and what would make it fit.
fn too_many(subscribers: u128, capacity: u64, pool: usize, per_address: u32, n: u32, range: u32, ports: (u16, u16)) -> String {
    let count = subscribers;
    let need_addrs = subscribers.div_ceil(u128::from(per_address));
    let per_addr_needed = subscribers.div_ceil(pool.max(1) as u128);
    let hint = match u128::from(range) / per_addr_needed {
        0 => String::new(),
        m => format!(", or ports_per_subscriber = {m} or less"),
    };
    let need = if need_addrs > u128::from(u32::MAX) { "more pool addresses than IPv4 has".to_owned() } else { format!("{need_addrs} pool addresses") };
    format!(
        "{count} subscribers do not fit: with ports {}-{} ({range} ports, {per_address} ranges of {n} per address) \
         the pool's {pool} address(es) can hold {capacity} subscribers; {count} subscribers need {need}{hint}",
        ports.0, ports.1,
    )
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
        DeterministicConfig { subscribers: prefixes.iter().map(|&(a, l)| SubscriberPrefix::Ipv4(a, l)).collect(), ports_per_subscriber: n }
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
            let sub = d.member_of(index).unwrap();
            let a = d.assignment_of(sub).unwrap();
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
        assert_eq!(d.owner(POOL[0], 1024 + 3 * 1000).unwrap().subscriber, Member::Ipv4(ip([100, 64, 0, 3])));
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

    fn b4(last: u16) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, last)
    }

    #[test]
    fn b4s_and_ipv4_subscribers_share_one_numbering_in_configured_order() {
        let cfg = DeterministicConfig { subscribers: vec![SubscriberPrefix::B4(b4(0), 120), SubscriberPrefix::Ipv4(ip([100, 64, 0, 0]), 24)], ports_per_subscriber: 252 };
        let d = Deterministic::new(&cfg, &POOL, (1024, 65535)).unwrap();
        assert_eq!((d.subscriber_count(), d.ranges_per_address()), (512, 256));
        let a = d.assignment_of(Member::B4(b4(0x81))).unwrap();
        assert_eq!((a.index, a.ext_addr, a.first), (0x81, POOL[0], 1024 + 0x81 * 252));
        let a = d.assignment(ip([100, 64, 0, 3])).unwrap();
        assert_eq!((a.index, a.ext_addr, a.first), (259, POOL[1], 1024 + 3 * 252));
        assert_eq!(d.owner(POOL[0], 1024 + 0x81 * 252).unwrap().subscriber, Member::B4(b4(0x81)));
        assert_eq!(d.assignment_of(Member::B4(b4(0x100))), None, "outside the /120");
        // A B4 whose bits equal an IPv4 subscriber's mapped address is still a B4.
        assert_eq!(d.assignment_of(Member::B4(std::net::Ipv6Addr::from(0xffff_6440_0003u128))), None);
        assert!(d.numbers_b4s());
        assert_eq!(d.prefixes().collect::<Vec<_>>(), [(ip([100, 64, 0, 0]), 24)]);
    }

    #[test]
    fn b4_prefixes_that_do_not_fit_or_hide_ipv4_are_refused() {
        let det = |p: SubscriberPrefix| Deterministic::new(&DeterministicConfig { subscribers: vec![p], ports_per_subscriber: 504 }, &POOL, (1024, 65535));
        let e = det(SubscriberPrefix::B4(b4(0), 64)).unwrap_err();
        assert_eq!(e.key, "subscribers");
        assert!(e.problem.starts_with("18446744073709551616 subscribers do not fit"), "{}", e.problem);
        assert!(e.problem.contains("can hold 256 subscribers"), "{}", e.problem);
        let e = det(SubscriberPrefix::B4(std::net::Ipv6Addr::UNSPECIFIED, 0)).unwrap_err();
        assert_eq!(e.key, "subscribers[0]");
        assert!(e.problem.contains("IPv4-mapped"), "{}", e.problem);
        assert!(det(SubscriberPrefix::B4(b4(0), 120)).is_ok());
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
                assert_eq!(d.owner(addr, port).map(|o| o.subscriber), Some(Member::Ipv4(sub)));
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
