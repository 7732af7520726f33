//! The fast path: the common packet (IPv4 without options or fragmentation,
//! TCP or UDP, belonging to a session that exists) translated straight from
//! the frame's bytes, with the address, port and TTL patched under one
//! checksum update per header. It changes nothing until it has recognised
//! the packet; anything else (first packets, ICMP, hairpins, fragments,
//! options, PCP, exempt traffic, anything malformed) returns None and
//! `process` takes the full path, which decides every case on its own. The
//! fast path only does less work for the one case it knows.

use natrix_wire::{ethernet, get_u16_at, get_u32_at, proto};

use crate::engine::{is_martian, Engine};
use crate::trackers::Direction;
use crate::translate::{self, Which, L4};
use crate::{Proto, Side};

const L3: usize = ethernet::HEADER_LEN;
const IP_HEADER: usize = 20;
const TCP_HEADER: usize = 20;
const UDP_HEADER: usize = 8;

impl Engine {
    /// Translates `frame` if it is the common case; returns the side it
    /// leaves on, or None (frame untouched) for the full path to decide.
    /// `hash` is the lookup hash when a batch has computed it already.
    #[inline]
    pub(crate) fn fast_path(&mut self, frame: &mut [u8], side: Side, hash: Option<u64>) -> Option<Side> {
        let p = self.recognise(frame, side, hash)?;
        let (out, dir, refresh) = match side {
            Side::Inside => (Side::Outside, Direction::Out, true),
            Side::Outside => (Side::Inside, Direction::In, self.cfg.inbound_refresh),
        };
        self.track(p.session, dir, p.tcp_flags, refresh);
        let s = self.tables.session(p.session);
        let (which, addr, port) = match side {
            Side::Inside => (Which::Src, s.ext_addr, s.ext_port),
            Side::Outside => (Which::Dst, s.int_addr, s.int_port),
        };
        translate::rewrite_forward(frame, L3, p.l4, which, addr, port);
        Some(out)
    }

    /// The checks the full path would make, in a form that only accepts:
    /// each one failing sends the frame there.
    #[inline]
    fn recognise(&self, frame: &[u8], side: Side, hash: Option<u64>) -> Option<Recognised> {
        if frame.len() < L3 + IP_HEADER || get_u16_at(frame, 12) != ethernet::ETHERTYPE_IPV4 || frame[L3] != 0x45 {
            return None;
        }
        let total = usize::from(get_u16_at(frame, L3 + 2));
        // More-fragments and offset both clear; TTL left to decrement.
        if total < IP_HEADER || total > frame.len() - L3 || get_u16_at(frame, L3 + 6) & 0x3fff != 0 || frame[L3 + 8] <= 1 {
            return None;
        }
        let at = L3 + IP_HEADER;
        let l4_len = total - IP_HEADER;
        let (proto, l4, tcp_flags) = match frame[L3 + 9] {
            proto::TCP if l4_len >= TCP_HEADER && (TCP_HEADER..=l4_len).contains(&(usize::from(frame[at + 12] >> 4) * 4)) => (Proto::Tcp, L4::Tcp { at, len: l4_len }, frame[at + 13]),
            proto::UDP if l4_len >= UDP_HEADER && (UDP_HEADER..=l4_len).contains(&usize::from(get_u16_at(frame, at + 4))) => (Proto::Udp, L4::Udp { at }, 0),
            _ => return None,
        };
        let (src, dst) = (get_u32_at(frame, L3 + 12), get_u32_at(frame, L3 + 16));
        let egress = match side {
            Side::Inside => Side::Outside,
            Side::Outside => Side::Inside,
        };
        let mtu = self.cfg.egress_mtu[egress as usize];
        if is_martian(src) || is_martian(dst) || (mtu != 0 && total > usize::from(mtu)) || !self.cfg.exempt.is_empty() || !header_checksum_ok(&frame[L3..at]) {
            return None;
        }
        let (sport, dport) = (get_u16_at(frame, at), get_u16_at(frame, at + 2));
        let session = match side {
            // Hairpins and the NAT's own address take the full path.
            Side::Inside if dst != self.cfg.inside_addr && !self.pool.contains(dst) => {
                let h = hash.unwrap_or_else(|| self.tables.hash_in(proto, src, sport));
                self.tables.find_session_in_hashed(h, proto, src, sport, dst, dport)?
            }
            Side::Outside if self.pool.contains(dst) => {
                let h = hash.unwrap_or_else(|| self.tables.hash_out(proto, dst, dport));
                self.tables.find_session_out_hashed(h, proto, dst, dport, src, sport)?
            }
            _ => return None,
        };
        Some(Recognised { session, l4, tcp_flags })
    }
}

struct Recognised {
    session: u32,
    l4: L4,
    tcp_flags: u8,
}

/// RFC 1071: a 20-byte header whose checksum is right sums to all ones.
/// Summed as five 32-bit words (the one's complement sum is the same).
#[inline]
fn header_checksum_ok(h: &[u8]) -> bool {
    let sum: u64 = (0..5).map(|i| u64::from(get_u32_at(h, 4 * i))).sum();
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    (sum & 0xffff) + (sum >> 16) == 0xffff
}
