//! What a router does around the NAT: answer ARP for natrix's addresses,
//! find next hops (the outside gateway or on-link hosts) with a cache and a
//! small queue for frames waiting on resolution, and write the Ethernet
//! addresses of every frame that leaves. No I/O here: frames to send go to
//! a callback, and time comes from the caller.

use std::collections::{HashMap, VecDeque};

use natrix_engine::config::prefix_contains;
use natrix_engine::Side;
use natrix_wire::{arp, ethernet, get_u32_at};

const BROADCAST: [u8; 6] = [0xff; 6];
const NS: u64 = 1_000_000_000;
/// A learned neighbour is trusted this long without hearing from it again;
/// after that natrix keeps using it while asking again (Linux's STALE and
/// PROBE states), and forgets it only if it stays silent for the grace period.
const NEIGHBOUR_LIFETIME_NS: u64 = 300 * NS;
const NEIGHBOUR_GRACE_NS: u64 = 5 * NS;
/// Learned neighbours per link: ARP from a flood of made-up senders must not
/// grow the table without bound.
const MAX_NEIGHBOURS: usize = 65536;
/// At most one ARP request per next hop this often.
const REQUEST_INTERVAL_NS: u64 = NS;
/// Frames wait this long for their next hop to answer.
const PENDING_LIFETIME_NS: u64 = 3 * NS;
const PENDING_PER_SIDE: usize = 256;
const ARP_FRAME_LEN: usize = 60;

/// One of natrix's two links.
#[derive(Debug, Clone)]
pub struct Link {
    pub mac: [u8; 6],
    pub addr: u32,
    pub prefix_len: u8,
    /// Addresses natrix answers ARP for on this link: its own and, outside,
    /// pool addresses inside the link's prefix.
    pub answers_for: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct GatewayCounters {
    pub arp_replies_sent: u64,
    pub arp_requests_sent: u64,
    /// Unicast frames for another host's MAC (a bridge flooding them to us).
    pub not_for_us: u64,
    /// Neither IPv4 nor ARP (IPv6, LLDP, ...), VLAN-tagged (natrix's live
    /// interfaces carry untagged traffic), or IPv4 sent to a group MAC.
    pub not_ipv4: u64,
    /// No next hop: off-link inside, or off-link outside with no gateway.
    pub no_route: u64,
    /// Frames whose next hop never answered, or that found the queue full.
    pub unresolved: u64,
}

/// What to do with a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress {
    /// An IPv4 frame for the engine.
    Engine,
    /// Handled here (ARP) or dropped (counted).
    Consumed,
}

#[derive(Default)]
struct Neighbours {
    known: HashMap<u32, ([u8; 6], u64)>,
    asked: HashMap<u32, u64>,
    pending: VecDeque<(u32, u64, Vec<u8>)>,
}

pub struct Gateway {
    links: [Link; 2],
    gateway: Option<u32>,
    neighbours: [Neighbours; 2],
    pub counters: GatewayCounters,
}

impl Gateway {
    pub fn new(inside: Link, outside: Link, gateway: Option<u32>) -> Gateway {
        Gateway { links: [inside, outside], gateway, neighbours: Default::default(), counters: GatewayCounters::default() }
    }

    /// Reloads what a SIGHUP may change: the addresses answered for (pool
    /// additions or removals).
    pub fn set_answers_for(&mut self, side: Side, addrs: Vec<u32>) {
        self.links[side as usize].answers_for = addrs;
    }

    /// Takes a received frame: ARP is answered or learned from here, IPv4 for
    /// natrix's MAC (or broadcast) goes on to the engine.
    pub fn ingress(&mut self, side: Side, frame: &[u8], now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) -> Ingress {
        let Ok(eth) = ethernet::Frame::new_checked(frame) else {
            self.counters.not_ipv4 += 1;
            return Ingress::Consumed;
        };
        let dst = eth.dst_addr();
        if dst != self.links[side as usize].mac && dst[0] & 1 == 0 {
            self.counters.not_for_us += 1;
            return Ingress::Consumed;
        }
        if eth.payload_offset() != ethernet::HEADER_LEN {
            self.counters.not_ipv4 += 1;
            return Ingress::Consumed;
        }
        match eth.ethertype() {
            // RFC 1812 section 5.3.4: no forwarding of link-layer broadcasts.
            ethernet::ETHERTYPE_IPV4 if dst[0] & 1 != 0 => {
                self.counters.not_ipv4 += 1;
                Ingress::Consumed
            }
            ethernet::ETHERTYPE_IPV4 => Ingress::Engine,
            ethernet::ETHERTYPE_ARP => {
                self.arp_received(side, &frame[eth.payload_offset()..], now_ns, tx);
                Ingress::Consumed
            }
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
        let for_us = self.links[side as usize].answers_for.contains(&p.target_addr());
        // RFC 826: refresh a known sender always; learn a new one only when
        // the packet was meant for us, and only on-link unicast senders.
        let link = &self.links[side as usize];
        let plausible = prefix_contains(link.addr, link.prefix_len, p.sender_addr()) && p.sender_mac()[0] & 1 == 0;
        if plausible && (for_us || self.neighbours[side as usize].known.contains_key(&p.sender_addr())) {
            self.learn(side, p.sender_addr(), p.sender_mac(), now_ns, tx);
        }
        if for_us && p.operation() == arp::OP_REQUEST {
            let link = &self.links[side as usize];
            let mut f = [0u8; ARP_FRAME_LEN];
            write_arp(&mut f, p.sender_mac(), link.mac, arp::OP_REPLY, (link.mac, p.target_addr()), (p.sender_mac(), p.sender_addr()));
            tx(side, &f);
            self.counters.arp_replies_sent += 1;
        }
    }

    fn learn(&mut self, side: Side, addr: u32, mac: [u8; 6], now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        let n = &mut self.neighbours[side as usize];
        if n.known.len() >= MAX_NEIGHBOURS && !n.known.contains_key(&addr) {
            n.known.retain(|_, &mut (_, learned)| now_ns.saturating_sub(learned) < NEIGHBOUR_LIFETIME_NS + NEIGHBOUR_GRACE_NS);
            if n.known.len() >= MAX_NEIGHBOURS {
                return;
            }
        }
        n.known.insert(addr, (mac, now_ns));
        n.asked.remove(&addr);
        let src = self.links[side as usize].mac;
        let waiting = std::mem::take(&mut n.pending);
        for (hop, since, mut frame) in waiting {
            if hop == addr {
                set_macs(&mut frame, mac, src);
                tx(side, &frame);
            } else {
                n.pending.push_back((hop, since, frame));
            }
        }
    }

    /// Sends a frame out on `side`, addressed to its next hop; a frame whose
    /// next hop is not known yet waits while natrix asks for it.
    pub fn egress(&mut self, side: Side, frame: &mut [u8], now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        let Some(hop) = self.next_hop(side, frame) else {
            self.counters.no_route += 1;
            return;
        };
        let src = self.links[side as usize].mac;
        let n = &mut self.neighbours[side as usize];
        match n.known.get(&hop).map(|&(mac, learned)| (mac, now_ns.saturating_sub(learned))) {
            Some((mac, age)) if age < NEIGHBOUR_LIFETIME_NS + NEIGHBOUR_GRACE_NS => {
                set_macs(frame, mac, src);
                tx(side, frame);
                if age >= NEIGHBOUR_LIFETIME_NS {
                    self.ask(side, hop, now_ns, tx);
                }
            }
            _ => {
                if n.pending.len() >= PENDING_PER_SIDE {
                    self.counters.unresolved += 1;
                } else {
                    n.pending.push_back((hop, now_ns, frame.to_vec()));
                }
                self.ask(side, hop, now_ns, tx);
            }
        }
    }

    fn next_hop(&self, side: Side, frame: &[u8]) -> Option<u32> {
        let eth = ethernet::Frame::new_checked(frame).ok()?;
        let l3 = eth.payload_offset();
        if frame.len() < l3 + 20 {
            return None;
        }
        let dst = get_u32_at(frame, l3 + 16);
        let link = &self.links[side as usize];
        if prefix_contains(link.addr, link.prefix_len, dst) {
            Some(dst)
        } else if side == Side::Outside {
            self.gateway
        } else {
            None
        }
    }

    fn ask(&mut self, side: Side, hop: u32, now_ns: u64, tx: &mut dyn FnMut(Side, &[u8])) {
        let n = &mut self.neighbours[side as usize];
        if n.asked.get(&hop).is_some_and(|&t| now_ns.saturating_sub(t) < REQUEST_INTERVAL_NS) {
            return;
        }
        n.asked.insert(hop, now_ns);
        let link = &self.links[side as usize];
        let mut f = [0u8; ARP_FRAME_LEN];
        write_arp(&mut f, BROADCAST, link.mac, arp::OP_REQUEST, (link.mac, link.addr), ([0; 6], hop));
        tx(side, &f);
        self.counters.arp_requests_sent += 1;
    }

    /// Announces natrix's addresses (gratuitous ARP), so neighbours that
    /// cached another MAC for them, say of a previous NAT, update at once.
    pub fn announce(&mut self, tx: &mut dyn FnMut(Side, &[u8])) {
        for side in [Side::Inside, Side::Outside] {
            let link = &self.links[side as usize];
            for &addr in &link.answers_for {
                let mut f = [0u8; ARP_FRAME_LEN];
                write_arp(&mut f, BROADCAST, link.mac, arp::OP_REQUEST, (link.mac, addr), ([0; 6], addr));
                tx(side, &f);
            }
        }
    }

    /// Drops frames that waited too long for a next hop.
    pub fn expire(&mut self, now_ns: u64) {
        for n in &mut self.neighbours {
            while n.pending.front().is_some_and(|&(_, since, _)| now_ns.saturating_sub(since) > PENDING_LIFETIME_NS) {
                n.pending.pop_front();
                self.counters.unresolved += 1;
            }
        }
    }
}

fn set_macs(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
}

fn write_arp(f: &mut [u8; ARP_FRAME_LEN], dst: [u8; 6], src: [u8; 6], op: u16, sender: ([u8; 6], u32), target: ([u8; 6], u32)) {
    set_macs(f, dst, src);
    f[12..14].copy_from_slice(&ethernet::ETHERTYPE_ARP.to_be_bytes());
    arp::emit(&mut f[14..14 + arp::PACKET_LEN], op, sender, target);
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

    fn gateway() -> Gateway {
        Gateway::new(
            Link { mac: NAT_IN, addr: INSIDE, prefix_len: 10, answers_for: vec![INSIDE] },
            Link { mac: NAT_OUT, addr: OUTSIDE, prefix_len: 24, answers_for: vec![OUTSIDE, ONLINK_POOL] },
            Some(GW),
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
        let sent = collect(&mut g, |g, tx| g.egress(Side::Outside, &mut frame, 0, tx));
        assert_eq!(sent.len(), 1, "only the ARP request goes out");
        assert_eq!(arp::Packet::new_checked(&sent[0].1[14..]).unwrap().target_addr(), GW);
        let gw_mac = [2, 0, 0, 0, 0, 0xfe];
        let sent = collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(NAT_OUT, arp::OP_REPLY, (gw_mac, GW), OUTSIDE), 1, tx);
        });
        assert_eq!(sent.len(), 1, "the waiting frame leaves");
        assert_eq!(&sent[0].1[0..12], &[gw_mac, NAT_OUT].concat()[..]);
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
        g.egress(Side::Inside, &mut off, 0, &mut |_, _| panic!("no route inside"));
        assert_eq!((g.counters.not_for_us, g.counters.no_route), (1, 1));
    }

    #[test]
    fn a_stale_neighbour_is_still_used_while_it_is_asked_again() {
        let mut g = gateway();
        let srv_mac = [2, 0, 0, 0, 0, 0x0b];
        collect(&mut g, |g, tx| {
            g.ingress(Side::Outside, &arp_frame(NAT_OUT, arp::OP_REPLY, (srv_mac, SERVER), OUTSIDE), 0, tx);
        });
        let sent = collect(&mut g, |g, tx| g.egress(Side::Outside, &mut ipv4_to(SERVER), NEIGHBOUR_LIFETIME_NS + 1, tx));
        assert_eq!(sent.len(), 2, "the frame leaves and a new request goes out");
        assert_eq!(&sent[0].1[0..6], &srv_mac);
        assert_eq!(arp::Packet::new_checked(&sent[1].1[14..]).unwrap().target_addr(), SERVER);
        let sent = collect(&mut g, |g, tx| g.egress(Side::Outside, &mut ipv4_to(SERVER), NEIGHBOUR_LIFETIME_NS + NEIGHBOUR_GRACE_NS + 1, tx));
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
        assert!(g.neighbours[1].known.is_empty());
    }

    #[test]
    fn unanswered_next_hop_is_asked_at_most_once_a_second_and_its_frames_expire() {
        let mut g = gateway();
        let sent = collect(&mut g, |g, tx| {
            for t in 0..5 {
                g.egress(Side::Outside, &mut ipv4_to(SERVER), t * 100_000_000, tx);
            }
        });
        assert_eq!(sent.len(), 1);
        g.expire(10 * NS);
        assert_eq!(g.counters.unresolved, 5);
    }
}
