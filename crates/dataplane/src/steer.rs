//! Which worker a received frame belongs to. Outbound: the subscriber's
//! worker, from the source address. Inbound: the worker owning the
//! external port the frame is for (for ICMP errors, the port in the quoted
//! header; for echo replies, the identifier). Non-first fragments carry no
//! port: they follow the worker their first fragment went to, remembered
//! here by (source, destination, identification, protocol).

use natrix_engine::shard::{worker_of_subscriber, Owners};
use natrix_engine::{Proto, Side};
use natrix_wire::{ethernet, get_u16_at, get_u32_at, icmp, proto};

const FRAGMENT_SLOTS: usize = 4096;

pub struct Steering {
    owners: Owners,
    fragments: Box<[(u64, u16)]>,
}

impl Steering {
    pub fn new(owners: Owners) -> Steering {
        Steering { owners, fragments: vec![(u64::MAX, 0); FRAGMENT_SLOTS].into_boxed_slice() }
    }

    pub fn workers(&self) -> u16 {
        self.owners.count()
    }

    pub fn worker_for(&mut self, side: Side, frame: &[u8]) -> u16 {
        let Some(ip) = Ip::parse(frame) else { return 0 };
        match side {
            Side::Inside => worker_of_subscriber(ip.src, self.owners.count()),
            Side::Outside => self.inbound_owner(frame, &ip),
        }
    }

    /// The owner of a frame leaving outside for a pool address: a hairpin
    /// the sending worker could not finish, which goes back in as inbound.
    pub fn hairpin_owner(&mut self, frame: &[u8]) -> Option<u16> {
        let ip = Ip::parse(frame)?;
        Some(self.inbound_owner(frame, &ip))
    }

    fn inbound_owner(&mut self, frame: &[u8], ip: &Ip) -> u16 {
        let key = fragment_key(ip);
        let slot = (key % FRAGMENT_SLOTS as u64) as usize;
        if ip.frag_offset != 0 {
            let (k, w) = self.fragments[slot];
            return if k == key { w } else { (key % u64::from(self.owners.count())) as u16 };
        }
        let w = self.owner_of_transport(frame, ip);
        if ip.more_frags {
            self.fragments[slot] = (key, w);
        }
        w
    }

    fn owner_of_transport(&self, frame: &[u8], ip: &Ip) -> u16 {
        let l4 = ip.l4;
        if frame.len() < l4 + 8 {
            return 0;
        }
        match ip.proto {
            proto::TCP => self.owners.of_external(Proto::Tcp, ip.dst, get_u16_at(frame, l4 + 2)),
            proto::UDP => self.owners.of_external(Proto::Udp, ip.dst, get_u16_at(frame, l4 + 2)),
            proto::ICMP if icmp::classify(frame[l4]) == icmp::Class::Error => self.owner_of_quoted(frame, l4 + 8),
            proto::ICMP => self.owners.of_external(Proto::Icmp, ip.dst, get_u16_at(frame, l4 + 4)),
            _ => 0,
        }
    }

    /// An ICMP error quotes the packet natrix sent: its source is the
    /// external address and port.
    fn owner_of_quoted(&self, frame: &[u8], at: usize) -> u16 {
        if frame.len() < at + 20 {
            return 0;
        }
        let ihl = usize::from(frame[at] & 0x0f) * 4;
        let (q_proto, q_src) = (frame[at + 9], get_u32_at(frame, at + 12));
        let l4 = at + ihl;
        if frame.len() < l4 + 8 {
            return 0;
        }
        match Proto::from_ip(q_proto) {
            Some(Proto::Icmp) => self.owners.of_external(Proto::Icmp, q_src, get_u16_at(frame, l4 + 4)),
            Some(p) => self.owners.of_external(p, q_src, get_u16_at(frame, l4)),
            None => 0,
        }
    }
}

struct Ip {
    l4: usize,
    proto: u8,
    src: u32,
    dst: u32,
    ident: u16,
    frag_offset: u16,
    more_frags: bool,
}

impl Ip {
    fn parse(frame: &[u8]) -> Option<Ip> {
        let eth = ethernet::Frame::new_checked(frame).ok()?;
        let l3 = eth.payload_offset();
        if eth.ethertype() != ethernet::ETHERTYPE_IPV4 || frame.len() < l3 + 20 {
            return None;
        }
        let flags = get_u16_at(frame, l3 + 6);
        Some(Ip {
            l4: l3 + usize::from(frame[l3] & 0x0f) * 4,
            proto: frame[l3 + 9],
            src: get_u32_at(frame, l3 + 12),
            dst: get_u32_at(frame, l3 + 16),
            ident: get_u16_at(frame, l3 + 4),
            frag_offset: flags & 0x1fff,
            more_frags: flags & 0x2000 != 0,
        })
    }
}

fn fragment_key(ip: &Ip) -> u64 {
    let k = (u64::from(ip.src) << 32 | u64::from(ip.dst)) ^ (u64::from(ip.ident) << 8 | u64::from(ip.proto)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    k.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use natrix_engine::shard::{port_slice, Shard};

    fn udp_frame(src: u32, dst: u32, sport: u16, dport: u16, flags: u16, ident: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&[8, 0]);
        f[14] = 0x45;
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
        let mut s = Steering::new(Owners::new((1024, 65535), 2, 3, &[]));
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
        let mut s = Steering::new(Owners::new((1024, 65535), 2, 4, &[]));
        for a in 0..50u32 {
            let sub = 0x6440_0000 + a;
            assert_eq!(s.worker_for(Side::Inside, &udp_frame(sub, 9, 1000 + a as u16, 53, 0, 1)), worker_of_subscriber(sub, 4));
        }
    }
}
