//! Which worker a received frame belongs to. Outbound: the subscriber's
//! worker, from the source address. Inbound: the worker owning the
//! external port the frame is for (for ICMP errors, the port in the quoted
//! header; for echo replies, the identifier). Non-first fragments carry no
//! port: they follow the worker their first fragment went to, remembered
//! here by (source, destination, identification, protocol). Inbound SCTP
//! has no port natrix chose: it goes by tag (`sctp`).
//!
//! Without translation (`[nat] mode = "off"`) and for IPv6, natrix routes
//! and owns no per-port state: a frame goes to the worker of the inside
//! host's address, its source outbound and its destination inbound, so
//! both directions of a flow meet on one worker.
//!
//! What steering learns (fragments' owners, SCTP tags) is shared by every
//! clone, so per-queue workers, each steering what its own queues receive,
//! agree on it. It is locked only for fragments and SCTP. A later fragment
//! that reaches its worker before the first fragment's owner is learned
//! goes by hash, as without workers; NICs hash a datagram's fragments by
//! addresses alone, so they usually share a queue and arrive in order.

mod sctp;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use natrix_engine::nat44::sctp::SctpConfig;
use natrix_engine::shard::{worker_of_host6, worker_of_subscriber, Owners};
use natrix_engine::{Proto, Side};
use natrix_wire::{ethernet, icmp, ipv4, ipv6, proto, udp};

const FRAGMENT_SLOTS: usize = 4096;

#[derive(Clone)]
pub struct Steering {
    owners: Owners,
    /// False in router mode: IPv4 is steered like IPv6, by address.
    translate: bool,
    learned: Arc<Mutex<Learned>>,
}

/// What steering learns from the frames it sees.
struct Learned {
    /// The owner of each fragmented datagram's first fragment.
    fragments: Box<[(u64, u16)]>,
    /// Inbound SCTP goes by tag to the worker that opened the association.
    sctp: sctp::SctpOwners,
}

/// A frame's network header, as far as steering reads it.
enum Network<'a> {
    V4(ipv4::Packet<&'a [u8]>),
    V6(ipv6::Packet<&'a [u8]>),
}

impl Steering {
    pub fn new(owners: Owners, translate: bool) -> Steering {
        let sctp = sctp::SctpOwners::new(&SctpConfig { max_associations: 0, ..SctpConfig::default() }, 1);
        let learned = Learned { fragments: vec![(u64::MAX, 0); FRAGMENT_SLOTS].into_boxed_slice(), sctp };
        Steering { owners, translate, learned: Arc::new(Mutex::new(learned)) }
    }

    fn learned(&self) -> MutexGuard<'_, Learned> {
        self.learned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Steers SCTP by tag for the associations `cfg` allows on each worker;
    /// one worker needs no steering.
    pub fn with_sctp(self, cfg: &SctpConfig) -> Steering {
        if self.owners.count() > 1 {
            self.learned().sctp = sctp::SctpOwners::new(cfg, self.owners.count());
        }
        self
    }

    /// Learns from a frame worker `worker` sends out which SCTP tags it owns.
    pub fn learn_sent(&mut self, worker: u16, frame: &[u8]) {
        if self.owners.count() <= 1 {
            return;
        }
        if let Some(Network::V4(ip)) = network(frame) {
            if ip.protocol() == proto::SCTP && ip.frag_offset() == 0 {
                self.learned().sctp.learn_sent(worker, ip.src_addr(), ip.payload());
            }
        }
    }

    pub fn workers(&self) -> u16 {
        self.owners.count()
    }

    pub fn worker_for(&mut self, side: Side, frame: &[u8]) -> u16 {
        let count = self.owners.count();
        match (network(frame), side) {
            (Some(Network::V4(ip)), Side::Inside) => worker_of_subscriber(ip.src_addr(), count),
            (Some(Network::V4(ip)), Side::Outside) if !self.translate => worker_of_subscriber(ip.dst_addr(), count),
            (Some(Network::V4(ip)), Side::Outside) => self.inbound_owner(&ip),
            (Some(Network::V6(ip)), Side::Inside) => worker_of_host6(ip.src_addr(), count),
            (Some(Network::V6(ip)), Side::Outside) => worker_of_host6(ip.dst_addr(), count),
            (None, _) => 0,
        }
    }

    /// The owner of a frame leaving outside for a pool address: a hairpin
    /// the sending worker could not finish, which goes back in as inbound.
    pub fn hairpin_owner(&mut self, frame: &[u8]) -> Option<u16> {
        match network(frame)? {
            Network::V4(ip) => Some(self.inbound_owner(&ip)),
            Network::V6(_) => None,
        }
    }

    fn inbound_owner(&mut self, ip: &ipv4::Packet<&[u8]>) -> u16 {
        let key = fragment_key(ip);
        let slot = (key % FRAGMENT_SLOTS as u64) as usize;
        if ip.frag_offset() != 0 {
            let (k, w) = self.learned().fragments[slot];
            return if k == key { w } else { (key % u64::from(self.owners.count())) as u16 };
        }
        let w = match ip.protocol() {
            proto::SCTP if self.owners.count() <= 1 => 0,
            proto::SCTP => self.learned().sctp.steer_inbound(ip.dst_addr(), ip.payload()),
            p => self.owner_of_transport(p, ip.dst_addr(), ip.payload()),
        };
        if ip.more_frags() {
            self.learned().fragments[slot] = (key, w);
        }
        w
    }

    /// The owner of the external address `dst` and the port (or ICMP
    /// identifier) in `l4`. TCP and UDP both begin with the two ports,
    /// which the lax 8-byte view reads.
    fn owner_of_transport(&self, protocol: u8, dst: u32, l4: &[u8]) -> u16 {
        match protocol {
            proto::TCP | proto::UDP => match (udp::Packet::new_lax(l4), Proto::from_ip(protocol)) {
                (Ok(ports), Some(p)) => self.owners.of_external(p, dst, ports.dst_port()),
                _ => 0,
            },
            proto::ICMP => match icmp::Packet::new_checked(l4) {
                Ok(m) if icmp::classify(m.msg_type()) == icmp::Class::Error => self.owner_of_quoted(m.quoted()),
                Ok(m) => self.owners.of_external(Proto::Icmp, dst, m.ident()),
                Err(_) => 0,
            },
            _ => 0,
        }
    }

    /// An ICMP error quotes the packet natrix sent: its source is the
    /// external address and port; an SCTP packet's association is found
    /// by its tag, as the remote's packets are.
    fn owner_of_quoted(&self, quoted: &[u8]) -> u16 {
        let Ok(q) = ipv4::Packet::new_lax(quoted) else { return 0 };
        let l4 = &quoted[q.header_len()..];
        match Proto::from_ip(q.protocol()) {
            Some(Proto::Icmp) => icmp::Packet::new_checked(l4).map_or(0, |m| self.owners.of_external(Proto::Icmp, q.src_addr(), m.ident())),
            Some(Proto::Sctp) if self.owners.count() > 1 => self.learned().sctp.owner_of_sent(q.src_addr(), l4).unwrap_or(0),
            Some(p) => udp::Packet::new_lax(l4).map_or(0, |ports| self.owners.of_external(p, q.src_addr(), ports.src_port())),
            None => 0,
        }
    }
}

/// The network header of an untagged or tagged Ethernet frame.
fn network(frame: &[u8]) -> Option<Network<'_>> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    let l3 = &frame[eth.payload_offset()..];
    match eth.ethertype() {
        ethernet::ETHERTYPE_IPV4 => ipv4::Packet::new_lax(l3).ok().map(Network::V4),
        ethernet::ETHERTYPE_IPV6 => ipv6::Packet::new_lax(l3).ok().map(Network::V6),
        _ => None,
    }
}

fn fragment_key(ip: &ipv4::Packet<&[u8]>) -> u64 {
    let (src, dst) = (u64::from(ip.src_addr()), u64::from(ip.dst_addr()));
    let k = (src << 32 | dst) ^ (u64::from(ip.ident()) << 8 | u64::from(ip.protocol())).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    k.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use natrix_engine::shard::{port_slice, Shard};
    use std::net::Ipv6Addr;

    fn udp_frame(src: u32, dst: u32, sport: u16, dport: u16, flags: u16, ident: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&[8, 0]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[18..20].copy_from_slice(&ident.to_be_bytes());
        f[20..22].copy_from_slice(&flags.to_be_bytes());
        f[23] = proto::UDP;
        f[26..30].copy_from_slice(&src.to_be_bytes());
        f[30..34].copy_from_slice(&dst.to_be_bytes());
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn inbound_goes_to_the_worker_whose_slice_holds_the_port_and_fragments_follow() {
        let mut s = Steering::new(Owners::new((1024, 65535), 2, 3, &[]), true);
        for index in 0..3u16 {
            let (lo, _) = port_slice((1024, 65535), 2, Shard { index, count: 3 });
            let first = udp_frame(1, 2, 53, lo + 1, 0x2000, 77 + index);
            assert_eq!(s.worker_for(Side::Outside, &first), index);
            let later = udp_frame(1, 2, 0, 0, 0x0004, 77 + index);
            assert_eq!(s.worker_for(Side::Outside, &later), index);
        }
    }

    #[test]
    fn outbound_goes_to_the_subscribers_worker() {
        let mut s = Steering::new(Owners::new((1024, 65535), 2, 4, &[]), true);
        for a in 0..50u32 {
            let sub = 0x6440_0000 + a;
            assert_eq!(s.worker_for(Side::Inside, &udp_frame(sub, 9, 1000 + a as u16, 53, 0, 1)), worker_of_subscriber(sub, 4));
        }
    }

    fn ipv6_frame(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40];
        f[12..14].copy_from_slice(&ethernet::ETHERTYPE_IPV6.to_be_bytes());
        ipv6::emit_header(&mut f[14..], src, dst, ipv6::next_header::NO_NEXT_HEADER, 0, 64).unwrap();
        f
    }

    #[test]
    fn ipv6_goes_to_the_inside_hosts_worker_both_ways_and_spreads() {
        let mut s = Steering::new(Owners::new((1024, 65535), 2, 4, &[]), true);
        let server: Ipv6Addr = "2001:db8:99::1".parse().unwrap();
        let mut used = [false; 4];
        for i in 0..64u16 {
            let host = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, i);
            let out = s.worker_for(Side::Inside, &ipv6_frame(host, server));
            assert_eq!(s.worker_for(Side::Outside, &ipv6_frame(server, host)), out, "{host}");
            assert_eq!(out, worker_of_host6(host, 4));
            used[usize::from(out)] = true;
        }
        assert_eq!(used, [true; 4], "64 hosts use every worker");
        assert_eq!(s.hairpin_owner(&ipv6_frame(server, server)), None);
    }

    #[test]
    fn without_translation_ipv4_goes_to_the_inside_hosts_worker_both_ways() {
        let mut s = Steering::new(Owners::new((1024, 65535), 2, 4, &[]), false);
        for a in 0..50u32 {
            let host = 0x6440_0000 + a;
            let out = s.worker_for(Side::Inside, &udp_frame(host, 9, 1000 + a as u16, 53, 0, 1));
            assert_eq!(s.worker_for(Side::Outside, &udp_frame(9, host, 53, 1000 + a as u16, 0, 1)), out);
        }
    }

    #[test]
    fn icmp_errors_go_to_the_owner_of_the_quoted_source_port() {
        let mut s = Steering::new(Owners::new((1024, 65535), 2, 3, &[]), true);
        for index in 0..3u16 {
            let (lo, _) = port_slice((1024, 65535), 2, Shard { index, count: 3 });
            // What natrix sent: from the pool address and a port of worker `index`.
            let sent = udp_frame(0xcb00_7101, 0x0808_0808, lo + 7, 53, 0, 1);
            let mut f = vec![0u8; 14 + 20 + 8];
            f[12..14].copy_from_slice(&[8, 0]);
            f[14] = 0x45;
            f[16..18].copy_from_slice(&((20 + 8 + 28) as u16).to_be_bytes());
            f[23] = proto::ICMP;
            f[34] = icmp::kind::DEST_UNREACHABLE;
            f.extend_from_slice(&sent[14..]);
            assert_eq!(s.worker_for(Side::Outside, &f), index);
        }
    }
}
