//! What a router does around the NAT: answer ARP (IPv4) and Neighbor
//! Solicitations (IPv6, RFC 4861) for natrix's addresses, find next hops
//! (the outside gateways or on-link hosts) with a cache per family and
//! side and a small queue for frames waiting on resolution, and write the
//! Ethernet addresses of every frame that leaves. No I/O here: frames to
//! send go to a callback, and time comes from the caller.
//!
//! Routing: a destination inside the side's prefix (IPv4 `address`, IPv6
//! `address6`) is on-link; outside, anything else goes to the gateway
//! (`gateway`, `gateway6`); inside, anything else has no route. A side
//! without `address6` routes no IPv6 and answers no Neighbor Discovery.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::Ipv6Addr;
use std::sync::Arc;

use natrix_engine::config::{prefix_contains, Addr6};
use natrix_engine::state::hash;
use natrix_engine::Side;
use natrix_wire::icmpv6::{self, NeighborAdvert, NeighborMessage, NeighborSolicit};
use natrix_wire::{arp, ethernet, ipv4, ipv6};

pub mod moves;
use moves::{Move, MoveLog};

const BROADCAST: [u8; 6] = [0xff; 6];
const NS: u64 = 1_000_000_000;
/// A learned neighbour is trusted this long without hearing from it again;
/// after that natrix keeps using it while asking again (Linux's STALE and
/// PROBE states), and forgets it only if it stays silent for the grace period.
const NEIGHBOUR_LIFETIME_NS: u64 = 300 * NS;
const NEIGHBOUR_GRACE_NS: u64 = 5 * NS;
/// Learned neighbours per family and link: ARP or NDP from a flood of
/// made-up senders must not grow the table without bound.
const MAX_NEIGHBOURS: usize = 65536;
/// Past this many, a neighbour is learned only where natrix asked for it:
/// a flood of requests from made-up senders fills the table up to here
/// and no further, and next hops natrix needs still find room.
const UNSOLICITED_NEIGHBOURS: usize = MAX_NEIGHBOURS / 4 * 3;
/// A table past `UNSOLICITED_NEIGHBOURS` forgets its silent neighbours at
/// most this often: a pass over the whole table, not one per frame of a flood.
const FORGET_EVERY_NS: u64 = NS;
/// At most one request (ARP request, Neighbor Solicitation) per next hop this often.
const REQUEST_INTERVAL_NS: u64 = NS;
/// Next hops with a request outstanding, per family and link: frames to a
/// whole on-link /64 must not grow the table without bound either.
const MAX_ASKED: usize = 4096;
/// Frames wait this long for their next hop to answer.
const PENDING_LIFETIME_NS: u64 = 3 * NS;
const PENDING_PER_SIDE: usize = 256;
const ARP_FRAME_LEN: usize = 60;
/// A Neighbor Solicitation or Advertisement with one link-layer address option.
const ND_FRAME_LEN: usize = ethernet::HEADER_LEN + ipv6::HEADER_LEN + icmpv6::ND_LEN + 8;

/// One of natrix's two links.
#[derive(Debug, Clone)]
pub struct Link {
    pub mac: [u8; 6],
    pub addr: u32,
    pub prefix_len: u8,
    /// Addresses natrix answers ARP for on this link: its own and, outside,
    /// pool addresses inside the link's prefix.
    pub answers_for: Vec<u32>,
    /// natrix's IPv6 address on this link and the link's prefix
    /// (`address6`): answered in Neighbor Discovery, the source of the
    /// solicitations natrix sends, and the on-link IPv6 prefix.
    pub addr6: Option<Addr6>,
    /// Other IPv6 addresses natrix answers Neighbor Solicitations for on
    /// this link: inside, the DS-Lite AFTR's softwire endpoint.
    pub answers_for6: Vec<Ipv6Addr>,
}

#[derive(Debug, Clone, Default)]
pub struct GatewayCounters {
    pub arp_replies_sent: u64,
    pub arp_requests_sent: u64,
    /// Neighbor Advertisements natrix sent for its IPv6 addresses.
    pub nd_adverts_sent: u64,
    /// Neighbor Solicitations natrix sent to find IPv6 next hops.
    pub nd_solicits_sent: u64,
    /// Unicast frames for another host's MAC (a bridge flooding them to us).
    pub not_for_us: u64,
    /// Neither IP nor ARP (LLDP, ...), VLAN-tagged (natrix's live interfaces
    /// carry untagged traffic), IP sent to a group MAC (Neighbor Discovery
    /// aside), or a malformed ARP or Neighbor Discovery message.
    pub not_ipv4: u64,
    /// No next hop: off-link inside, off-link outside with no gateway of
    /// the frame's family, or IPv6 on a side without `address6`.
    pub no_route: u64,
    /// Frames whose next hop never answered, or that found the queue full.
    pub unresolved: u64,
}

/// What to do with a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress {
    /// An IPv4 or IPv6 frame for the engine.
    Engine,
    /// Handled here (ARP, Neighbor Discovery) or dropped (counted).
    Consumed,
}

/// Where a frame leaving on a side goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextHop {
    V4(u32),
    V6(Ipv6Addr),
}

pub struct Gateway {
    links: [Link; 2],
    gateway: Option<u32>,
    gateway6: Option<Ipv6Addr>,
    v4: [Neighbours<u32>; 2],
    /// Keyed by the address as a u128.
    v6: [Neighbours<u128>; 2],
    pub counters: GatewayCounters,
    /// Known IPv4 neighbours that moved to another link-layer address.
    moves: Arc<MoveLog>,
}

impl Gateway {
    pub fn new(inside: Link, outside: Link, gateway: Option<u32>, gateway6: Option<Ipv6Addr>) -> Gateway {
        let seed = Seeded::random();
        let moves = Arc::new(MoveLog::default());
        Gateway {
            links: [inside, outside],
            gateway,
            gateway6,
            v4: [Side::Inside, Side::Outside].map(|side| Neighbours::new(seed, Some((moves.clone(), side)))),
            v6: [(); 2].map(|_| Neighbours::new(seed, None)),
            counters: GatewayCounters::default(),
            moves,
        }
    }

    /// The known IPv4 neighbours that moved to another link-layer address,
    /// shared: it grows as they move.
    pub fn moves(&self) -> Arc<MoveLog> {
        self.moves.clone()
    }

    /// Reloads what a SIGHUP may change: the addresses answered for (pool
    /// additions or removals).
    pub fn set_answers_for(&mut self, side: Side, addrs: Vec<u32>) {
        self.links[side as usize].answers_for = addrs;
    }

    /// Reloads the IPv6 addresses answered for besides the link's own (a
    /// DS-Lite AFTR address changed).
    pub fn set_answers_for6(&mut self, side: Side, addrs: Vec<Ipv6Addr>) {
        self.links[side as usize].answers_for6 = addrs;
    }

    pub fn mac(&self, side: Side) -> [u8; 6] {
        self.links[side as usize].mac
    }

    /// Takes a received frame: ARP and Neighbor Discovery are answered or
    /// learned from here; IPv4 and IPv6 for natrix's MAC go on to the engine.
    pub fn ingress(&mut self, side: Side, frame: &[u8], now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) -> Ingress {
        let Ok(eth) = ethernet::Frame::new_checked(frame) else {
            self.counters.not_ipv4 += 1;
            return Ingress::Consumed;
        };
        let dst = eth.dst_addr();
        let group = dst[0] & 1 != 0;
        if dst != self.links[side as usize].mac && !group {
            self.counters.not_for_us += 1;
            return Ingress::Consumed;
        }
        if eth.payload_offset() != ethernet::HEADER_LEN {
            self.counters.not_ipv4 += 1;
            return Ingress::Consumed;
        }
        let l3 = &frame[eth.payload_offset()..];
        match eth.ethertype() {
            // RFC 1812 section 5.3.4: no forwarding of link-layer broadcasts.
            ethernet::ETHERTYPE_IPV4 if group => {
                self.counters.not_ipv4 += 1;
                Ingress::Consumed
            }
            ethernet::ETHERTYPE_IPV4 => Ingress::Engine,
            ethernet::ETHERTYPE_ARP => {
                self.arp_received(side, l3, now_ns, tx);
                Ingress::Consumed
            }
            ethernet::ETHERTYPE_IPV6 => match ipv6::Packet::new_checked(l3) {
                Ok(ip) if is_neighbor_discovery(&ip) => {
                    self.nd_received(side, eth.src_addr(), &ip, now_ns, tx);
                    Ingress::Consumed
                }
                // Link-scope multicast (router solicitations, MLD, ...) is
                // the link's business, not something to route.
                _ if group => {
                    self.counters.not_ipv4 += 1;
                    Ingress::Consumed
                }
                _ => Ingress::Engine,
            },
            _ => {
                self.counters.not_ipv4 += 1;
                Ingress::Consumed
            }
        }
    }

    fn arp_received(&mut self, side: Side, payload: &[u8], now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        let Ok(p) = arp::Packet::new_checked(payload) else {
            self.counters.not_ipv4 += 1;
            return;
        };
        let s = side as usize;
        let for_us = self.links[s].answers_for.contains(&p.target_addr());
        // RFC 826: refresh a known sender always; learn a new one only when
        // the packet was meant for us, and only on-link unicast senders.
        let link = &self.links[s];
        let plausible = prefix_contains(link.addr, link.prefix_len, p.sender_addr()) && is_unicast_mac(p.sender_mac());
        if plausible && (for_us || self.v4[s].knows(p.sender_addr())) {
            let src = link.mac;
            self.v4[s].learn(p.sender_addr(), p.sender_mac(), now_ns, src, &mut |f| tx(side, f));
        }
        if for_us && p.operation() == arp::OP_REQUEST {
            let link = &self.links[s];
            let mut f = [0u8; ARP_FRAME_LEN];
            write_arp(&mut f, p.sender_mac(), link.mac, arp::OP_REPLY, (link.mac, p.target_addr()), (p.sender_mac(), p.sender_addr()));
            tx(side, &f);
            self.counters.arp_replies_sent += 1;
        }
    }

    /// A Neighbor Solicitation or Advertisement (RFC 4861 sections 7.1 and
    /// 7.2): a solicitation for natrix's `address6` is answered and its
    /// sender learned; an advertisement teaches a next hop natrix asked for
    /// or already knows. Messages that fail validation are dropped.
    fn nd_received(&mut self, side: Side, eth_src: [u8; 6], ip: &ipv6::Packet<&[u8]>, now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        let s = side as usize;
        let Some(own) = self.links[s].addr6 else { return };
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        let body = ip.payload();
        let valid = icmpv6::Packet::new_checked(body).is_ok_and(|m| m.verify_checksum(src, dst));
        let msg = match NeighborMessage::new_checked(body) {
            Ok(m) if valid && m.valid_for(ip.hop_limit(), src, dst) => m,
            _ => {
                self.counters.not_ipv4 += 1;
                return;
            }
        };
        let mac = self.links[s].mac;
        if msg.is_solicitation() {
            let target = msg.target_addr();
            if target != own.addr && !self.links[s].answers_for6.contains(&target) {
                return;
            }
            // Section 7.2.3: the solicitation's sender becomes a neighbour.
            if let Some(ll) = msg.source_ll_addr().filter(|&ll| !src.is_unspecified() && plausible6(own, src, ll)) {
                self.v6[s].learn(u128::from(src), ll, now_ns, mac, &mut |f| tx(side, f));
            }
            let na = NeighborAdvert::answer(src, target, mac, true);
            let to = if src.is_unspecified() { icmpv6::multicast_mac(na.dst) } else { msg.source_ll_addr().unwrap_or(eth_src) };
            let mut f = [0u8; ND_FRAME_LEN];
            write_ethernet(&mut f, to, mac, ethernet::ETHERTYPE_IPV6);
            if let Ok(n) = na.emit(&mut f[ethernet::HEADER_LEN..]) {
                tx(side, &f[..ethernet::HEADER_LEN + n]);
                self.counters.nd_adverts_sent += 1;
            }
        } else {
            // Section 7.2.5: an advertisement nobody asked for creates nothing.
            let target = msg.target_addr();
            let key = u128::from(target);
            let ll = msg.target_ll_addr().unwrap_or(eth_src);
            if (self.v6[s].knows(key) || self.v6[s].asked(key)) && plausible6(own, target, ll) {
                self.v6[s].learn(key, ll, now_ns, mac, &mut |f| tx(side, f));
            }
        }
    }

    /// Writes the next hop's address into `frame` where it lies and says
    /// whether it may leave on `side` now; otherwise the gateway keeps a
    /// copy until the next hop answers (or drops it) and `tx` gets the
    /// request for the next hop's address.
    pub fn address(&mut self, side: Side, frame: &mut [u8], now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) -> bool {
        let s = side as usize;
        let src = self.links[s].mac;
        let (forwarded, hop) = match self.next_hop(side, frame) {
            Some(hop @ NextHop::V4(a)) => (self.v4[s].forward(a, frame, now_ns, src), hop),
            Some(hop @ NextHop::V6(a)) => (self.v6[s].forward(u128::from(a), frame, now_ns, src), hop),
            None => {
                self.counters.no_route += 1;
                return false;
            }
        };
        match forwarded {
            Forwarded::Sent => return true,
            Forwarded::Refused => self.counters.unresolved += 1,
            Forwarded::SentStale | Forwarded::Queued => {}
        }
        match hop {
            NextHop::V4(a) => self.ask4(side, a, now_ns, tx),
            NextHop::V6(a) => self.ask6(side, a, now_ns, tx),
        }
        forwarded == Forwarded::SentStale
    }

    /// The Ethernet addresses (destination, source) a frame to the IPv4
    /// address `dst` leaving on `side` gets now: its next hop's, learnt
    /// and not past its grace period (as a frame the workers address is
    /// sent), and natrix's own. None where the next hop is not known;
    /// nothing is asked or queued. What the XDP offload writes into the
    /// frames it forwards.
    ///
    /// A next hop past its lifetime is asked for again at the next
    /// `expire`, as it is when a frame the workers address finds it so:
    /// otherwise one that never speaks to natrix would be forgotten after
    /// its grace period, and its flows handed back to the workers at once.
    pub fn ethernet_to(&mut self, side: Side, dst: u32, now_ns: u64) -> Option<[u8; 12]> {
        let s = side as usize;
        let hop = self.route4(side, dst)?;
        let (mac, age) = self.v4[s].usable(hop, now_ns)?;
        if age >= NEIGHBOUR_LIFETIME_NS {
            self.v4[s].still_in_use(hop);
        }
        let mut both = [0u8; 12];
        both[..6].copy_from_slice(&mac);
        both[6..].copy_from_slice(&self.links[s].mac);
        Some(both)
    }

    fn next_hop(&self, side: Side, frame: &[u8]) -> Option<NextHop> {
        let eth = ethernet::Frame::new_checked(frame).ok()?;
        let l3 = &frame[eth.payload_offset()..];
        match eth.ethertype() {
            ethernet::ETHERTYPE_IPV4 => self.route4(side, ipv4::Packet::new_lax(l3).ok()?.dst_addr()).map(NextHop::V4),
            ethernet::ETHERTYPE_IPV6 => self.route6(side, ipv6::Packet::new_lax(l3).ok()?.dst_addr()).map(NextHop::V6),
            _ => None,
        }
    }

    fn route4(&self, side: Side, dst: u32) -> Option<u32> {
        let link = &self.links[side as usize];
        if prefix_contains(link.addr, link.prefix_len, dst) {
            Some(dst)
        } else if side == Side::Outside {
            self.gateway
        } else {
            None
        }
    }

    /// On-link inside the side's `address6` prefix; outside, anything else
    /// goes to `gateway6`. Multicast, link-local and other unroutable
    /// destinations have no next hop (RFC 4291 section 2.5.6).
    fn route6(&self, side: Side, dst: Ipv6Addr) -> Option<Ipv6Addr> {
        let own = self.links[side as usize].addr6?;
        if dst.is_multicast() || dst.is_unspecified() || dst.is_loopback() || is_link_local(dst) {
            None
        } else if prefix6_contains(own, dst) {
            Some(dst)
        } else if side == Side::Outside {
            self.gateway6
        } else {
            None
        }
    }

    /// An ARP request for `hop`, at most one a second.
    fn ask4(&mut self, side: Side, hop: u32, now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        let s = side as usize;
        if !self.v4[s].request_due(hop, now_ns) {
            return;
        }
        let link = &self.links[s];
        let mut f = [0u8; ARP_FRAME_LEN];
        write_arp(&mut f, BROADCAST, link.mac, arp::OP_REQUEST, (link.mac, link.addr), ([0; 6], hop));
        tx(side, &f);
        self.counters.arp_requests_sent += 1;
    }

    /// A Neighbor Solicitation for `hop` to its solicited-node multicast
    /// address (RFC 4861 section 7.2.2), at most one a second.
    fn ask6(&mut self, side: Side, hop: Ipv6Addr, now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        let s = side as usize;
        let Some(own) = self.links[s].addr6 else { return };
        if !self.v6[s].request_due(u128::from(hop), now_ns) {
            return;
        }
        let mac = self.links[s].mac;
        let ns = NeighborSolicit::resolve(own.addr, hop, mac);
        let mut f = [0u8; ND_FRAME_LEN];
        write_ethernet(&mut f, icmpv6::multicast_mac(ns.dst), mac, ethernet::ETHERTYPE_IPV6);
        if let Ok(n) = ns.emit(&mut f[ethernet::HEADER_LEN..]) {
            tx(side, &f[..ethernet::HEADER_LEN + n]);
            self.counters.nd_solicits_sent += 1;
        }
    }

    /// Announces natrix's addresses (gratuitous ARP, unsolicited Neighbor
    /// Advertisements to all nodes, RFC 4861 section 7.2.6), so neighbours
    /// that cached another MAC for them, say of a previous NAT, update at once.
    pub fn announce(&mut self, tx: &mut dyn FnMut(Side, &[u8])) {
        for side in [Side::Inside, Side::Outside] {
            let link = &self.links[side as usize];
            for &addr in &link.answers_for {
                let mut f = [0u8; ARP_FRAME_LEN];
                write_arp(&mut f, BROADCAST, link.mac, arp::OP_REQUEST, (link.mac, addr), ([0; 6], addr));
                tx(side, &f);
            }
            if let Some(own) = link.addr6 {
                let na = NeighborAdvert {
                    src: own.addr,
                    dst: icmpv6::ALL_NODES,
                    target: own.addr,
                    flags: icmpv6::na_flags::ROUTER | icmpv6::na_flags::OVERRIDE,
                    target_ll: Some(link.mac),
                };
                let mut f = [0u8; ND_FRAME_LEN];
                write_ethernet(&mut f, icmpv6::multicast_mac(na.dst), link.mac, ethernet::ETHERTYPE_IPV6);
                if let Ok(n) = na.emit(&mut f[ethernet::HEADER_LEN..]) {
                    tx(side, &f[..ethernet::HEADER_LEN + n]);
                }
            }
        }
    }

    /// Drops frames that waited too long for a next hop, and asks again
    /// for the next hops past their lifetime that `ethernet_to` found.
    pub fn expire(&mut self, now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        for n in &mut self.v4 {
            self.counters.unresolved += n.expire(now_ns);
        }
        for n in &mut self.v6 {
            self.counters.unresolved += n.expire(now_ns);
        }
        for side in [Side::Inside, Side::Outside] {
            let stale: Vec<u32> = self.v4[side as usize].stale_in_use.drain().collect();
            for hop in stale {
                self.ask4(side, hop, now_ns, tx);
            }
        }
    }
}

/// Whether `ingress` would hand `frame` to the engine without looking
/// further: untagged IPv4, or IPv6 that is not ICMPv6, sent to `mac`
/// (natrix's on the side it arrived on). Shared gateways check this first,
/// so that the bulk of the traffic takes no lock.
pub fn plainly_for_the_engine(mac: [u8; 6], frame: &[u8]) -> bool {
    const NEXT_HEADER: usize = ethernet::HEADER_LEN + 6;
    frame.len() > NEXT_HEADER
        && frame[..6] == mac
        && match u16::from_be_bytes([frame[12], frame[13]]) {
            ethernet::ETHERTYPE_IPV4 => true,
            ethernet::ETHERTYPE_IPV6 => frame[NEXT_HEADER] != ipv6::next_header::ICMPV6,
            _ => false,
        }
}

/// What became of a frame handed to a neighbour table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forwarded {
    /// Addressed to a neighbour heard from recently.
    Sent,
    /// Addressed to a neighbour not heard from for a while: time to ask again.
    SentStale,
    /// Waiting for its next hop to answer.
    Queued,
    /// The queue is full: dropped.
    Refused,
}

/// One family's neighbours on one link: those learned, those asked for, and
/// the frames waiting for an answer. Every map is bounded.
struct Neighbours<K> {
    known: HashMap<K, ([u8; 6], u64), Seeded>,
    asked: HashMap<K, u64, Seeded>,
    pending: VecDeque<(K, u64, Vec<u8>)>,
    /// Where moves are told (the IPv4 neighbours of a side), and the side.
    moves: Option<(Arc<MoveLog>, Side)>,
    /// When the table may next forget its silent neighbours.
    next_forget_ns: u64,
    /// Next hops past their lifetime that frames still go to without the
    /// workers (the XDP offload), to ask for again (`Gateway::expire`).
    stale_in_use: HashSet<K, Seeded>,
}

impl<K: Copy + Eq + Hash> Neighbours<K> {
    fn new(seed: Seeded, moves: Option<(Arc<MoveLog>, Side)>) -> Neighbours<K> {
        Neighbours {
            known: HashMap::with_hasher(seed),
            asked: HashMap::with_hasher(seed),
            pending: VecDeque::new(),
            moves,
            next_forget_ns: 0,
            stale_in_use: HashSet::with_hasher(seed),
        }
    }

    fn knows(&self, addr: K) -> bool {
        self.known.contains_key(&addr)
    }

    fn asked(&self, addr: K) -> bool {
        self.asked.contains_key(&addr)
    }

    /// Learns that `addr` is at `mac` and sends, from `src`, the frames that
    /// waited for it; a new neighbour only where the table has room for it
    /// (`room_for`).
    fn learn(&mut self, addr: K, mac: [u8; 6], now_ns: u64, src: [u8; 6], tx: &mut dyn FnMut(&[u8])) {
        if !self.known.contains_key(&addr) && !self.room_for(addr, now_ns) {
            return;
        }
        match (self.known.insert(addr, (mac, now_ns)), &self.moves) {
            (Some((old, _)), Some((log, side))) if old != mac => log.record(Move { side: *side, old, new: mac }),
            _ => {}
        }
        self.asked.remove(&addr);
        for (hop, since, mut frame) in std::mem::take(&mut self.pending) {
            if hop == addr {
                set_macs(&mut frame, mac, src);
                tx(&frame);
            } else {
                self.pending.push_back((hop, since, frame));
            }
        }
    }

    /// Whether a new neighbour `addr` may be learned. Past
    /// `UNSOLICITED_NEIGHBOURS` the table first forgets those silent past
    /// the grace period (at most once a second); if it is still that full,
    /// only a next hop natrix asked for is learned, in the place of any
    /// other neighbour where the table is full (that one is asked for
    /// again when natrix next needs it).
    fn room_for(&mut self, addr: K, now_ns: u64) -> bool {
        if self.known.len() >= UNSOLICITED_NEIGHBOURS && now_ns >= self.next_forget_ns {
            self.next_forget_ns = now_ns + FORGET_EVERY_NS;
            self.known.retain(|_, &mut (_, learned)| now_ns.saturating_sub(learned) < NEIGHBOUR_LIFETIME_NS + NEIGHBOUR_GRACE_NS);
        }
        if self.known.len() < UNSOLICITED_NEIGHBOURS {
            return true;
        }
        if !self.asked.contains_key(&addr) {
            return false;
        }
        if self.known.len() >= MAX_NEIGHBOURS {
            let any = self.known.keys().next().copied();
            if let Some(other) = any {
                self.known.remove(&other);
            }
        }
        true
    }

    /// `hop`'s address and how long ago it was learnt, where frames may
    /// still be sent to it: within its lifetime and grace period.
    fn usable(&self, hop: K, now_ns: u64) -> Option<([u8; 6], u64)> {
        let &(mac, learned) = self.known.get(&hop)?;
        let age = now_ns.saturating_sub(learned);
        (age < NEIGHBOUR_LIFETIME_NS + NEIGHBOUR_GRACE_NS).then_some((mac, age))
    }

    /// Addresses `frame` from `src` to `hop` for sending, or queues a copy
    /// until `hop` answers.
    fn forward(&mut self, hop: K, frame: &mut [u8], now_ns: u64, src: [u8; 6]) -> Forwarded {
        match self.usable(hop, now_ns) {
            Some((mac, age)) => {
                set_macs(frame, mac, src);
                if age >= NEIGHBOUR_LIFETIME_NS {
                    Forwarded::SentStale
                } else {
                    Forwarded::Sent
                }
            }
            _ if self.pending.len() >= PENDING_PER_SIDE => Forwarded::Refused,
            _ => {
                self.pending.push_back((hop, now_ns, frame.to_vec()));
                Forwarded::Queued
            }
        }
    }

    /// Whether a request for `hop` may go out now (at most one a second),
    /// noting it as sent.
    fn request_due(&mut self, hop: K, now_ns: u64) -> bool {
        if self.asked.get(&hop).is_some_and(|&t| now_ns.saturating_sub(t) < REQUEST_INTERVAL_NS) {
            return false;
        }
        if self.asked.len() >= MAX_ASKED && !self.asked.contains_key(&hop) {
            // Entries older than the interval only ever allowed a new request.
            self.asked.retain(|_, &mut t| now_ns.saturating_sub(t) < REQUEST_INTERVAL_NS);
            if self.asked.len() >= MAX_ASKED {
                return false;
            }
        }
        self.asked.insert(hop, now_ns);
        true
    }

    /// Notes that frames still go to `hop`, past its lifetime, without
    /// passing `forward`; as many as requests may be outstanding.
    fn still_in_use(&mut self, hop: K) {
        if self.stale_in_use.len() < MAX_ASKED {
            self.stale_in_use.insert(hop);
        }
    }

    /// Drops the frames that waited too long; returns how many.
    fn expire(&mut self, now_ns: u64) -> u64 {
        let mut dropped = 0;
        while self.pending.front().is_some_and(|&(_, since, _)| now_ns.saturating_sub(since) > PENDING_LIFETIME_NS) {
            self.pending.pop_front();
            dropped += 1;
        }
        dropped
    }
}

/// Seeded hashing of next-hop addresses with natrix's own mixer
/// (`natrix_engine::hash`): the tables are looked up for every frame that
/// leaves, and SipHash would cost more than the rest of the lookup. The
/// seed is random, so outsiders cannot aim colliding addresses at a bucket.
#[derive(Debug, Clone, Copy)]
struct Seeded(u64);

impl Seeded {
    fn random() -> Seeded {
        Seeded(std::collections::hash_map::RandomState::new().hash_one(0x6e61_7472_6978_u64))
    }
}

impl BuildHasher for Seeded {
    type Hasher = AddrHasher;

    fn build_hasher(&self) -> AddrHasher {
        AddrHasher(self.0)
    }
}

struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(4) {
            let mut word = [0u8; 4];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u32(u32::from_ne_bytes(word));
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = hash::address(self.0, v);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = hash::five_tuple(self.0, 0, (v >> 32) as u32, 0, v as u32, 0);
    }

    fn write_u128(&mut self, v: u128) {
        self.write_u64((v >> 64) as u64);
        self.write_u64(v as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// ICMPv6 Neighbor Solicitation or Advertisement right after the fixed
/// header (RFC 4861 messages carry no extension headers).
fn is_neighbor_discovery(ip: &ipv6::Packet<&[u8]>) -> bool {
    ip.next_header() == ipv6::next_header::ICMPV6 && matches!(ip.payload().first(), Some(&(icmpv6::kind::NEIGHBOR_SOLICITATION | icmpv6::kind::NEIGHBOR_ADVERTISEMENT)))
}

/// A neighbour natrix may learn on a link: on-link (the prefix or
/// link-local) at a unicast MAC.
fn plausible6(own: Addr6, addr: Ipv6Addr, mac: [u8; 6]) -> bool {
    is_unicast_mac(mac) && !addr.is_multicast() && !addr.is_unspecified() && (prefix6_contains(own, addr) || is_link_local(addr))
}

fn prefix6_contains(net: Addr6, addr: Ipv6Addr) -> bool {
    let len = u32::from(net.prefix_len.min(128));
    len == 0 || (u128::from(net.addr) ^ u128::from(addr)) >> (128 - len) == 0
}

/// fe80::/10.
fn is_link_local(addr: Ipv6Addr) -> bool {
    addr.segments()[0] & 0xffc0 == 0xfe80
}

fn is_unicast_mac(mac: [u8; 6]) -> bool {
    mac[0] & 1 == 0
}

fn set_macs(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
}

/// Writes an untagged Ethernet header at the start of `f`.
fn write_ethernet(f: &mut [u8], dst: [u8; 6], src: [u8; 6], ethertype: u16) {
    set_macs(f, dst, src);
    f[12..ethernet::HEADER_LEN].copy_from_slice(&ethertype.to_be_bytes());
}

fn write_arp(f: &mut [u8; ARP_FRAME_LEN], dst: [u8; 6], src: [u8; 6], op: u16, sender: ([u8; 6], u32), target: ([u8; 6], u32)) {
    write_ethernet(f, dst, src, ethernet::ETHERTYPE_ARP);
    arp::emit(&mut f[ethernet::HEADER_LEN..ethernet::HEADER_LEN + arp::PACKET_LEN], op, sender, target);
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAT_IN: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const NAT_OUT: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const HOST: [u8; 6] = [2, 0, 0, 0, 0, 9];
    const INSIDE: u32 = 0x6440_0001; // 100.64.0.1
    const OUTSIDE: u32 = 0xc633_6401; // 198.51.100.1
    const ONLINK_POOL: u32 = 0xc633_640a; // 198.51.100.10
    const SERVER: u32 = 0xc633_640b; // 198.51.100.11
    const GW: u32 = 0xc633_64fe;
    const INSIDE6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
    /// A DS-Lite AFTR address on the inside link, beside `address6`.
    const AFTR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xaf);
    const OUTSIDE6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
    const SERVER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0xb);
    const GW6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0xfe);
    const FAR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x99, 0, 0, 0, 0, 1);

    fn gateway() -> Gateway {
        Gateway::new(
            Link { mac: NAT_IN, addr: INSIDE, prefix_len: 10, answers_for: vec![INSIDE], addr6: Some(Addr6 { addr: INSIDE6, prefix_len: 64 }), answers_for6: vec![AFTR] },
            Link {
                mac: NAT_OUT,
                addr: OUTSIDE,
                prefix_len: 24,
                answers_for: vec![OUTSIDE, ONLINK_POOL],
                addr6: Some(Addr6 { addr: OUTSIDE6, prefix_len: 64 }),
                answers_for6: vec![],
            },
            Some(GW),
            Some(GW6),
        )
    }

    fn arp_frame(dst: [u8; 6], op: u16, sender: ([u8; 6], u32), target: u32) -> [u8; ARP_FRAME_LEN] {
        let mut f = [0u8; ARP_FRAME_LEN];
        write_arp(&mut f, dst, sender.0, op, sender, ([0; 6], target));
        f
    }

    fn ipv4_to(dst: u32) -> Vec<u8> {
        let mut f = vec![0u8; 34];
        f[12..14].copy_from_slice(&[8, 0]);
        f[14] = 0x45;
        f[30..34].copy_from_slice(&dst.to_be_bytes());
        f
    }

    /// What the dataplane does with a frame it sends: addresses it and
    /// sends it, or leaves it waiting for its next hop.
    fn egress(g: &mut Gateway, side: Side, frame: &mut [u8], now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        if g.address(side, frame, now_ns, tx) {
            tx(side, frame);
        }
    }

    fn collect(g: &mut Gateway, run: impl FnOnce(&mut Gateway, &mut dyn FnMut(Side, &[u8]))) -> Vec<(Side, Vec<u8>)> {
        let mut sent = Vec::new();
        run(g, &mut |s, f| sent.push((s, f.to_vec())));
        sent
    }

    #[test]
    fn answers_arp_for_the_on_link_pool_address_and_not_for_others() {
        let mut g = gateway();
        let sent = collect(&mut g, |g, tx| {
            assert_eq!(g.ingress(Side::Outside, &arp_frame(BROADCAST, arp::OP_REQUEST, (HOST, SERVER), ONLINK_POOL), 0, tx), Ingress::Consumed);
            g.ingress(Side::Outside, &arp_frame(BROADCAST, arp::OP_REQUEST, (HOST, SERVER), 0xc633_6463), 0, tx);
        });
        assert_eq!(sent.len(), 1);
        let (side, f) = &sent[0];
        assert_eq!(*side, Side::Outside);
        assert_eq!(&f[0..6], &HOST);
        let p = arp::Packet::new_checked(&f[14..]).unwrap();
        assert_eq!((p.operation(), p.sender_mac(), p.sender_addr(), p.target_addr()), (arp::OP_REPLY, NAT_OUT, ONLINK_POOL, SERVER));
    }

    #[test]
    fn off_link_traffic_goes_to_the_gateway_after_resolution() {
        let mut g = gateway();
        let mut frame = ipv4_to(0x0808_0808);
        let sent = collect(&mut g, |g, tx| egress(g, Side::Outside, &mut frame, 0, tx));
        assert_eq!(sent.len(), 1, "only the ARP request goes out");
        assert_eq!(arp::Packet::new_checked(&sent[0].1[14..]).unwrap().target_addr(), GW);
        let gw_mac = [2, 0, 0, 0, 0, 0xfe];
        let sent = collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(NAT_OUT, arp::OP_REPLY, (gw_mac, GW), OUTSIDE), 1, tx);
        });
        assert_eq!(sent.len(), 1, "the waiting frame leaves");
        assert_eq!(&sent[0].1[0..12], &[gw_mac, NAT_OUT].concat()[..]);
    }

    /// A flood of ARP requests from made-up senders on the inside (a /10)
    /// fills the neighbour table only so far: a subscriber natrix must
    /// reach is still learned once it answers, and the flood costs a pass
    /// over the table at most once a second.
    #[test]
    fn a_flood_of_made_up_senders_leaves_room_for_the_neighbours_natrix_asks_for() {
        let mut g = gateway();
        let host = |i: u32| ([2, 0, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8], 0x6440_0100 + i);
        let flood = (UNSOLICITED_NEIGHBOURS + 1000) as u32;
        collect(&mut g, |g, tx| {
            for i in 0..flood {
                g.ingress(Side::Inside, &arp_frame(BROADCAST, arp::OP_REQUEST, host(i), INSIDE), NS, tx);
            }
        });
        assert_eq!(g.v4[0].known.len(), UNSOLICITED_NEIGHBOURS, "the flood stops at the mark");
        assert_eq!(g.v4[0].next_forget_ns, 2 * NS, "one pass over the table for the whole flood");
        // A subscriber natrix has a frame for: asked, answered, learned.
        let sub = (HOST, 0x6450_0009);
        let mut frame = ipv4_to(sub.1);
        let sent = collect(&mut g, |g, tx| egress(g, Side::Inside, &mut frame, 2 * NS, tx));
        assert_eq!(arp::Packet::new_checked(&sent[0].1[14..]).unwrap().target_addr(), sub.1, "natrix asks");
        let sent = collect(&mut g, |g, tx| {
            g.ingress(Side::Inside, &arp_frame(NAT_IN, arp::OP_REPLY, sub, INSIDE), 2 * NS + 1, tx);
        });
        assert_eq!(sent.len(), 1, "the waiting frame leaves");
        assert_eq!(&sent[0].1[0..6], &HOST);
        // Even in a table full to the last place.
        while g.v4[0].known.len() < MAX_NEIGHBOURS {
            let i = g.v4[0].known.len() as u32 + flood;
            g.v4[0].known.insert(host(i).1, (host(i).0, 2 * NS));
        }
        let other = ([2, 0, 0, 0, 0, 0x0b], 0x6450_000b);
        let mut frame = ipv4_to(other.1);
        collect(&mut g, |g, tx| egress(g, Side::Inside, &mut frame, 3 * NS, tx));
        let sent = collect(&mut g, |g, tx| {
            g.ingress(Side::Inside, &arp_frame(NAT_IN, arp::OP_REPLY, other, INSIDE), 3 * NS + 1, tx);
        });
        assert_eq!(sent.len(), 1, "learned in another's place");
        assert_eq!(g.v4[0].known.len(), MAX_NEIGHBOURS);
        // Silent past the grace period, the flood's senders are forgotten.
        let later = 2 * NS + NEIGHBOUR_LIFETIME_NS + NEIGHBOUR_GRACE_NS;
        collect(&mut g, |g, tx| {
            g.ingress(Side::Inside, &arp_frame(BROADCAST, arp::OP_REQUEST, host(flood + MAX_NEIGHBOURS as u32), INSIDE), later, tx);
        });
        assert!(g.v4[0].known.len() < 10, "{} left", g.v4[0].known.len());
    }

    /// The lock-free check never takes a frame the gateway would keep
    /// (ARP, Neighbor Discovery) or drop, and takes the plain traffic.
    #[test]
    fn what_is_plainly_for_the_engine_is_what_ingress_gives_it() {
        let mut g = gateway();
        let ns = ns_frame(HOST, SERVER6, OUTSIDE6, |_| {});
        let mut ns_to_us = ns.clone();
        ns_to_us[0..6].copy_from_slice(&NAT_OUT);
        let mut tcp6 = ns_to_us.clone();
        tcp6[20] = natrix_wire::proto::TCP;
        let mut broadcast = ipv4_to(SERVER);
        broadcast[0..6].copy_from_slice(&BROADCAST);
        let mut tagged = ipv4_to(SERVER);
        tagged[12..14].copy_from_slice(&[0x81, 0]);
        let mut unicast = ipv4_to(SERVER);
        unicast[0..6].copy_from_slice(&NAT_OUT);
        let mut elsewhere = ipv4_to(SERVER);
        elsewhere[0..6].copy_from_slice(&HOST);
        let arp_to_us = arp_frame(NAT_OUT, arp::OP_REPLY, (HOST, SERVER), OUTSIDE);
        let cases: [(&[u8], bool); 9] = [
            (&unicast, true),
            (&tcp6, true),
            (&ns, false),
            (&ns_to_us, false),
            (&broadcast, false),
            (&tagged, false),
            (&elsewhere, false),
            (&arp_to_us, false),
            (&unicast[..14], false),
        ];
        for (i, (frame, plain)) in cases.into_iter().enumerate() {
            assert_eq!(plainly_for_the_engine(NAT_OUT, frame), plain, "case {i}");
            if plain {
                assert_eq!(g.ingress(Side::Outside, frame, 0, &mut |_, _| {}), Ingress::Engine, "case {i}");
            }
        }
    }

    #[test]
    fn frames_for_another_mac_and_off_link_inside_are_refused() {
        let mut g = gateway();
        let mut f = ipv4_to(SERVER);
        f[0..6].copy_from_slice(&HOST);
        assert_eq!(g.ingress(Side::Outside, &f, 0, &mut |_, _| panic!("nothing to send")), Ingress::Consumed);
        f[0..6].copy_from_slice(&NAT_OUT);
        assert_eq!(g.ingress(Side::Outside, &f, 0, &mut |_, _| panic!("nothing to send")), Ingress::Engine);
        let mut off = ipv4_to(0x0a00_0001);
        egress(&mut g, Side::Inside, &mut off, 0, &mut |_, _| panic!("no route inside"));
        assert_eq!((g.counters.not_for_us, g.counters.no_route), (1, 1));
    }

    #[test]
    fn a_gratuitous_arp_moves_a_known_next_hop_at_once_and_is_counted() {
        let mut g = gateway();
        let moves = g.moves();
        let (old, new) = ([2, 0, 0, 0, 0, 0xfe], [2, 0, 0, 0, 0, 0xef]);
        collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(NAT_OUT, arp::OP_REPLY, (old, GW), OUTSIDE), 0, tx);
            // Refreshed as it was: no move.
            g.ingress(Side::Outside, &arp_frame(NAT_OUT, arp::OP_REPLY, (old, GW), OUTSIDE), 1, tx);
        });
        assert_eq!(moves.count(), 0, "learning a neighbour, or hearing it again, is no move");
        // A router failover's gratuitous ARP: a request for its own address.
        collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(BROADCAST, arp::OP_REQUEST, (new, GW), GW), 2, tx);
        });
        assert!(matches!(moves.since(0, moves.count()), moves::Since::Moves(m) if m == [Move { side: Side::Outside, old, new }]));
        let sent = collect(&mut g, |g, tx| egress(g, Side::Outside, &mut ipv4_to(0x0808_0808), 3, tx));
        assert_eq!(&sent[0].1[0..6], &new, "the next frame goes to the new address");
    }

    #[test]
    fn a_stale_neighbour_is_still_used_while_it_is_asked_again() {
        let mut g = gateway();
        let srv_mac = [2, 0, 0, 0, 0, 0x0b];
        collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(NAT_OUT, arp::OP_REPLY, (srv_mac, SERVER), OUTSIDE), 0, tx);
        });
        let sent = collect(&mut g, |g, tx| egress(g, Side::Outside, &mut ipv4_to(SERVER), NEIGHBOUR_LIFETIME_NS + 1, tx));
        assert_eq!(sent.len(), 2, "the frame leaves and a new request goes out");
        let (request, frame): (Vec<_>, Vec<_>) = sent.iter().partition(|(_, f)| f[12..14] == ethernet::ETHERTYPE_ARP.to_be_bytes());
        assert_eq!(&frame[0].1[0..6], &srv_mac);
        assert_eq!(arp::Packet::new_checked(&request[0].1[14..]).unwrap().target_addr(), SERVER);
        let sent = collect(&mut g, |g, tx| egress(g, Side::Outside, &mut ipv4_to(SERVER), NEIGHBOUR_LIFETIME_NS + NEIGHBOUR_GRACE_NS + 1, tx));
        assert_eq!(sent.len(), 1, "silent past the grace period: forgotten, the frame waits");
    }

    #[test]
    fn tagged_frames_and_broadcast_ipv4_are_not_translated() {
        let mut g = gateway();
        let mut tagged = vec![0u8; 38];
        tagged[0..6].copy_from_slice(&NAT_OUT);
        tagged[12..14].copy_from_slice(&[0x81, 0]);
        tagged[16..18].copy_from_slice(&[8, 0]);
        tagged[18] = 0x45;
        assert_eq!(g.ingress(Side::Outside, &tagged, 0, &mut |_, _| {}), Ingress::Consumed);
        let mut bcast = ipv4_to(SERVER);
        bcast[0..6].copy_from_slice(&BROADCAST);
        assert_eq!(g.ingress(Side::Outside, &bcast, 0, &mut |_, _| {}), Ingress::Consumed);
        assert_eq!(g.counters.not_ipv4, 2);
    }

    #[test]
    fn arp_from_off_link_senders_teaches_nothing() {
        let mut g = gateway();
        collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(BROADCAST, arp::OP_REQUEST, (HOST, 0x0a00_0001), ONLINK_POOL), 0, tx);
        });
        assert!(g.v4[1].known.is_empty());
    }

    /// The XDP offload's frames never pass `address`: a next hop they go
    /// to is asked for again once past its lifetime all the same, and so
    /// stays known while it answers.
    #[test]
    fn a_next_hop_only_the_offload_uses_is_asked_for_again_past_its_lifetime() {
        let mut g = gateway();
        let gw_mac = [2, 0, 0, 0, 0, 0xfe];
        collect(&mut g, |g, tx| egress(g, Side::Outside, &mut ipv4_to(0x0808_0808), 0, tx));
        collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(NAT_OUT, arp::OP_REPLY, (gw_mac, GW), OUTSIDE), 0, tx);
        });
        let fresh = NEIGHBOUR_LIFETIME_NS - NS;
        assert!(g.ethernet_to(Side::Outside, 0x0808_0808, fresh).is_some());
        assert!(collect(&mut g, |g, tx| g.expire(fresh, tx)).is_empty(), "nothing to ask while fresh");
        let stale = NEIGHBOUR_LIFETIME_NS + NS;
        assert!(g.ethernet_to(Side::Outside, 0x0808_0808, stale).is_some(), "still used in its grace period");
        let sent = collect(&mut g, |g, tx| g.expire(stale, tx));
        assert_eq!(sent.len(), 1, "asked again");
        assert_eq!(arp::Packet::new_checked(&sent[0].1[14..]).unwrap().target_addr(), GW);
        g.ethernet_to(Side::Outside, 0x0808_0808, stale + 1);
        assert!(collect(&mut g, |g, tx| g.expire(stale + 1, tx)).is_empty(), "at most once a second");
        collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(NAT_OUT, arp::OP_REPLY, (gw_mac, GW), OUTSIDE), stale + 2, tx);
        });
        let later = NEIGHBOUR_LIFETIME_NS + NEIGHBOUR_GRACE_NS + NS;
        assert!(g.ethernet_to(Side::Outside, 0x0808_0808, later).is_some(), "the answer renewed it");
    }

    #[test]
    fn unanswered_next_hop_is_asked_at_most_once_a_second_and_its_frames_expire() {
        let mut g = gateway();
        let sent = collect(&mut g, |g, tx| {
            for t in 0..5 {
                egress(g, Side::Outside, &mut ipv4_to(SERVER), t * 100_000_000, tx);
            }
        });
        assert_eq!(sent.len(), 1);
        g.expire(10 * NS, &mut |_, _| {});
        assert_eq!(g.counters.unresolved, 5);
    }

    fn ipv6_to(dst: Ipv6Addr) -> Vec<u8> {
        let mut f = vec![0u8; ethernet::HEADER_LEN + ipv6::HEADER_LEN];
        f[12..14].copy_from_slice(&ethernet::ETHERTYPE_IPV6.to_be_bytes());
        ipv6::emit_header(&mut f[14..], SERVER6, dst, ipv6::next_header::NO_NEXT_HEADER, 0, 64).unwrap();
        f
    }

    /// A Neighbor Solicitation from `src` (at `mac`) for `target`, to the
    /// target's solicited-node address; `edit` may spoil it afterwards.
    fn ns_frame(mac: [u8; 6], src: Ipv6Addr, target: Ipv6Addr, edit: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut ns = NeighborSolicit::resolve(src, target, mac);
        if src.is_unspecified() {
            ns.source_ll = None;
        }
        let mut f = vec![0u8; ND_FRAME_LEN];
        write_ethernet(&mut f, icmpv6::multicast_mac(ns.dst), mac, ethernet::ETHERTYPE_IPV6);
        let n = ns.emit(&mut f[14..]).unwrap();
        f.truncate(14 + n);
        edit(&mut f);
        f
    }

    fn na_frame(to_mac: [u8; 6], mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        let na = NeighborAdvert { src, dst, target: src, flags: icmpv6::na_flags::SOLICITED, target_ll: Some(mac) };
        let mut f = vec![0u8; ND_FRAME_LEN];
        write_ethernet(&mut f, to_mac, mac, ethernet::ETHERTYPE_IPV6);
        na.emit(&mut f[14..]).unwrap();
        f
    }

    /// The IPv6 packet and the Neighbor Discovery message of a frame natrix sent.
    fn nd_of(f: &[u8]) -> (ipv6::Packet<&[u8]>, NeighborMessage<&[u8]>) {
        let eth = ethernet::Frame::new_checked(f).unwrap();
        assert_eq!(eth.ethertype(), ethernet::ETHERTYPE_IPV6);
        let ip = ipv6::Packet::new_checked(&f[14..]).unwrap();
        let body = &f[14 + ipv6::HEADER_LEN..14 + ip.total_len()];
        let msg = NeighborMessage::new_checked(body).unwrap();
        assert!(icmpv6::Packet::new_checked(body).unwrap().verify_checksum(ip.src_addr(), ip.dst_addr()), "checksum");
        assert!(msg.valid_for(ip.hop_limit(), ip.src_addr(), ip.dst_addr()));
        (ip, msg)
    }

    #[test]
    fn answers_neighbor_solicitations_for_address6_and_learns_the_sender() {
        let mut g = gateway();
        let sent = collect(&mut g, |g, tx| {
            assert_eq!(g.ingress(Side::Outside, &ns_frame(HOST, SERVER6, OUTSIDE6, |_| {}), 0, tx), Ingress::Consumed);
        });
        assert_eq!(sent.len(), 1);
        let (side, f) = &sent[0];
        assert_eq!((*side, &f[0..6], &f[6..12]), (Side::Outside, &HOST[..], &NAT_OUT[..]));
        let (ip, na) = nd_of(f);
        assert_eq!((ip.src_addr(), ip.dst_addr(), ip.hop_limit()), (OUTSIDE6, SERVER6, 255));
        assert!(!na.is_solicitation());
        assert_eq!((na.target_addr(), na.target_ll_addr()), (OUTSIDE6, Some(NAT_OUT)));
        assert_eq!(na.flags(), icmpv6::na_flags::ROUTER | icmpv6::na_flags::SOLICITED | icmpv6::na_flags::OVERRIDE);
        assert_eq!(g.counters.nd_adverts_sent, 1);
        // The solicitation taught natrix where the server is: no solicitation of its own.
        let sent = collect(&mut g, |g, tx| egress(g, Side::Outside, &mut ipv6_to(SERVER6), 1, tx));
        assert_eq!(sent.len(), 1);
        assert_eq!(&sent[0].1[0..12], &[HOST, NAT_OUT].concat()[..]);
    }

    /// RFC 6333: B4s resolve the AFTR's address on the inside link.
    #[test]
    fn answers_neighbor_solicitations_for_the_aftr_on_the_inside_only() {
        let mut g = gateway();
        let b4 = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xb4);
        let sent = collect(&mut g, |g, tx| {
            g.ingress(Side::Inside, &ns_frame(HOST, b4, AFTR, |_| {}), 0, tx);
        });
        assert_eq!(sent.len(), 1);
        let (ip, na) = nd_of(&sent[0].1);
        assert_eq!((ip.src_addr(), ip.dst_addr()), (AFTR, b4));
        assert_eq!((na.target_addr(), na.target_ll_addr()), (AFTR, Some(NAT_IN)));
        let nothing = &mut |_: Side, _: &[u8]| panic!("the AFTR is an inside address");
        g.ingress(Side::Outside, &ns_frame(HOST, SERVER6, AFTR, |_| {}), 0, nothing);
    }

    #[test]
    fn a_duplicate_address_probe_is_answered_to_all_nodes() {
        let mut g = gateway();
        let sent = collect(&mut g, |g, tx| {
            g.ingress(Side::Inside, &ns_frame(HOST, Ipv6Addr::UNSPECIFIED, INSIDE6, |_| {}), 0, tx);
        });
        assert_eq!(sent.len(), 1);
        let (ip, na) = nd_of(&sent[0].1);
        assert_eq!(&sent[0].1[0..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!((ip.src_addr(), ip.dst_addr()), (INSIDE6, icmpv6::ALL_NODES));
        assert_eq!(na.flags() & icmpv6::na_flags::SOLICITED, 0);
        assert!(g.v6[0].known.is_empty(), "the unspecified address teaches nothing");
    }

    #[test]
    fn solicitations_for_others_or_that_fail_validation_are_not_answered() {
        let mut g = gateway();
        let nothing = &mut |_: Side, _: &[u8]| panic!("nothing to send");
        // For another address, for the other side's address, and on the wrong side.
        g.ingress(Side::Outside, &ns_frame(HOST, SERVER6, GW6, |_| {}), 0, nothing);
        g.ingress(Side::Outside, &ns_frame(HOST, SERVER6, INSIDE6, |_| {}), 0, nothing);
        assert_eq!(g.counters.not_ipv4, 0);
        // Hop limit 64: may have crossed a router (RFC 4861 section 7.1.1).
        g.ingress(Side::Outside, &ns_frame(HOST, SERVER6, OUTSIDE6, |f| f[21] = 64), 0, nothing);
        // A corrupted checksum.
        g.ingress(Side::Outside, &ns_frame(HOST, SERVER6, OUTSIDE6, |f| f[57] ^= 1), 0, nothing);
        // An option of length zero.
        g.ingress(Side::Outside, &ns_frame(HOST, SERVER6, OUTSIDE6, |f| f[79] = 0), 0, nothing);
        assert_eq!(g.counters.not_ipv4, 3);
        assert!(g.v6[1].known.is_empty());
        // A side without address6 answers nothing.
        let mut g = gateway();
        g.links[1].addr6 = None;
        assert_eq!(g.ingress(Side::Outside, &ns_frame(HOST, SERVER6, OUTSIDE6, |_| {}), 0, nothing), Ingress::Consumed);
    }

    #[test]
    fn ipv6_next_hops_are_solicited_and_frames_wait_for_the_advertisement() {
        let mut g = gateway();
        let mut frame = ipv6_to(FAR6);
        let sent = collect(&mut g, |g, tx| egress(g, Side::Outside, &mut frame, 0, tx));
        assert_eq!(sent.len(), 1, "only the solicitation goes out");
        let f = &sent[0].1;
        assert_eq!(&f[0..12], &[[0x33, 0x33, 0xff, 0, 0, 0xfe], NAT_OUT].concat()[..], "to the gateway's solicited-node group");
        let (ip, ns) = nd_of(f);
        assert_eq!((ip.src_addr(), ip.dst_addr()), (OUTSIDE6, icmpv6::solicited_node(GW6)));
        assert!(ns.is_solicitation());
        assert_eq!((ns.target_addr(), ns.source_ll_addr()), (GW6, Some(NAT_OUT)));
        assert_eq!(g.counters.nd_solicits_sent, 1);
        let gw_mac = [2, 0, 0, 0, 0, 0xfe];
        let sent = collect(&mut g, |g, tx| {
            assert_eq!(g.ingress(Side::Outside, &na_frame(NAT_OUT, gw_mac, GW6, OUTSIDE6), 1, tx), Ingress::Consumed);
        });
        assert_eq!(sent.len(), 1, "the waiting frame leaves");
        assert_eq!(&sent[0].1[0..12], &[gw_mac, NAT_OUT].concat()[..]);
        assert_eq!(&sent[0].1[14..], &ipv6_to(FAR6)[14..], "untouched but for its addresses");
    }

    #[test]
    fn unsolicited_advertisements_teach_nothing() {
        let mut g = gateway();
        collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &na_frame(NAT_OUT, HOST, SERVER6, OUTSIDE6), 0, tx);
        });
        assert!(g.v6[1].known.is_empty());
    }

    #[test]
    fn ipv6_routes_on_link_inside_the_prefix_and_outside_via_gateway6() {
        let mut g = gateway();
        let inside_host = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2);
        let link_local = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2);
        let cases = [
            (Side::Outside, SERVER6, Some(SERVER6)),
            (Side::Outside, FAR6, Some(GW6)),
            (Side::Outside, inside_host, Some(GW6)),
            (Side::Inside, inside_host, Some(inside_host)),
            (Side::Inside, FAR6, None),
            (Side::Outside, link_local, None),
            (Side::Outside, icmpv6::ALL_NODES, None),
            (Side::Outside, Ipv6Addr::UNSPECIFIED, None),
        ];
        for (side, dst, want) in cases {
            assert_eq!(g.next_hop(side, &ipv6_to(dst)), want.map(NextHop::V6), "{side:?} {dst}");
        }
        assert_eq!(g.next_hop(Side::Outside, &ipv4_to(0x0808_0808)), Some(NextHop::V4(GW)));
        g.gateway6 = None;
        assert_eq!(g.next_hop(Side::Outside, &ipv6_to(FAR6)), None, "no gateway6: only on-link");
        g.links[1].addr6 = None;
        assert_eq!(g.next_hop(Side::Outside, &ipv6_to(SERVER6)), None, "no address6: no IPv6 at all");
        egress(&mut g, Side::Outside, &mut ipv6_to(SERVER6), 0, &mut |_, _| panic!("no route"));
        assert_eq!(g.counters.no_route, 1);
    }

    #[test]
    fn ipv6_for_natrix_goes_to_the_engine_and_link_multicast_does_not() {
        let mut g = gateway();
        let mut f = ipv6_to(SERVER6);
        f[0..6].copy_from_slice(&NAT_OUT);
        assert_eq!(g.ingress(Side::Outside, &f, 0, &mut |_, _| {}), Ingress::Engine);
        f[0..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 2]);
        assert_eq!(g.ingress(Side::Outside, &f, 0, &mut |_, _| {}), Ingress::Consumed);
        f[0..6].copy_from_slice(&HOST);
        assert_eq!(g.ingress(Side::Outside, &f, 0, &mut |_, _| {}), Ingress::Consumed);
        assert_eq!((g.counters.not_ipv4, g.counters.not_for_us), (1, 1));
    }

    #[test]
    fn announce_sends_gratuitous_arp_and_unsolicited_advertisements() {
        let mut g = gateway();
        let sent = collect(&mut g, |g, tx| g.announce(tx));
        let arp_targets: Vec<(Side, u32)> =
            sent.iter().filter(|(_, f)| f[12..14] == [8, 6]).map(|(s, f)| (*s, arp::Packet::new_checked(&f[14..]).unwrap().target_addr())).collect();
        assert_eq!(arp_targets, [(Side::Inside, INSIDE), (Side::Outside, OUTSIDE), (Side::Outside, ONLINK_POOL)]);
        let adverts: Vec<(Side, Ipv6Addr, Ipv6Addr)> = sent
            .iter()
            .filter(|(_, f)| f[12..14] == [0x86, 0xdd])
            .map(|(s, f)| {
                let (ip, na) = nd_of(f);
                assert_eq!(na.flags(), icmpv6::na_flags::ROUTER | icmpv6::na_flags::OVERRIDE);
                (*s, ip.dst_addr(), na.target_addr())
            })
            .collect();
        assert_eq!(adverts, [(Side::Inside, icmpv6::ALL_NODES, INSIDE6), (Side::Outside, icmpv6::ALL_NODES, OUTSIDE6)]);
    }

    #[test]
    fn outstanding_requests_are_bounded_and_age_out() {
        let mut g = gateway();
        let mut solicits = 0;
        for i in 0..MAX_ASKED as u16 + 100 {
            let dst = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 1, i);
            egress(&mut g, Side::Outside, &mut ipv6_to(dst), 0, &mut |_, _| solicits += 1);
        }
        assert_eq!(solicits, MAX_ASKED);
        assert_eq!(g.v6[1].asked.len(), MAX_ASKED);
        assert_eq!(g.v6[1].pending.len(), PENDING_PER_SIDE);
        // A second later the old requests no longer count.
        egress(&mut g, Side::Outside, &mut ipv6_to(FAR6), REQUEST_INTERVAL_NS, &mut |_, _| solicits += 1);
        assert_eq!(solicits, MAX_ASKED + 1);
        assert_eq!(g.v6[1].asked.len(), 1);
    }

    #[test]
    fn seeded_hashes_tell_addresses_and_seeds_apart() {
        let (a, b) = (Seeded(1), Seeded(2));
        assert_ne!(a.hash_one(7u32), a.hash_one(8u32));
        assert_ne!(a.hash_one(7u32), b.hash_one(7u32));
        assert_ne!(a.hash_one(u128::from(SERVER6)), a.hash_one(u128::from(GW6)));
        assert_eq!(a.hash_one(u128::from(SERVER6)), a.hash_one(u128::from(SERVER6)));
    }
}
