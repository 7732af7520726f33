//! Frames the engine sends on its own (ICMP errors, released fragments) wait
//! in an output queue whose buffers are reused, so steady state allocates nothing.

use natrix_wire::{checksum, ethernet, icmp, ipv4, proto};

use crate::Side;

/// RFC 1812 section 4.3.2.3: an ICMP error carries as much of the offending
/// datagram as fits in 576 bytes.
const ICMP_ERROR_MAX: usize = 576;

pub struct OutFrame {
    pub side: Side,
    pub time_ns: u64,
    pub data: Vec<u8>,
}

#[derive(Default)]
pub struct OutQueue {
    frames: Vec<OutFrame>,
    spare: Vec<Vec<u8>>,
    /// A frame was pushed (not `push_final`) since the queue was last
    /// drained or taken from.
    own: bool,
    /// A frame that stands in a flow's order (one forwarded, released or
    /// rebuilt, not one natrix generated) was queued since the queue was
    /// last drained.
    ordered: bool,
}

impl OutQueue {
    /// A cleared buffer to fill.
    pub fn buffer(&mut self) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_else(|| Vec::with_capacity(2048));
        b.clear();
        b
    }

    /// Keeps a buffer for reuse: one from `buffer` that was not queued
    /// after all, or one taken out of the queue.
    pub fn recycle(&mut self, b: Vec<u8>) {
        self.spare.push(b);
    }

    pub fn push(&mut self, side: Side, time_ns: u64, data: Vec<u8>) {
        self.frames.push(OutFrame { side, time_ns, data });
        self.own = true;
    }

    /// `push` for a frame that stands in a flow's order.
    pub fn push_ordered(&mut self, side: Side, time_ns: u64, data: Vec<u8>) {
        self.push(side, time_ns, data);
        self.ordered = true;
    }

    /// `push_ordered` for a frame nothing will rebuild before it leaves.
    pub fn push_final(&mut self, side: Side, time_ns: u64, data: Vec<u8>) {
        self.frames.push(OutFrame { side, time_ns, data });
        self.ordered = true;
    }

    /// `push_final` at `at`, before the frames queued since the queue held
    /// `at` frames.
    pub fn insert_final(&mut self, at: usize, side: Side, time_ns: u64, data: Vec<u8>) {
        self.frames.insert(at, OutFrame { side, time_ns, data });
        self.ordered = true;
    }

    pub fn has_own(&self) -> bool {
        self.own
    }

    /// The queue's length, while it holds a frame that stands in a flow's
    /// order.
    pub fn ordered_len(&self) -> Option<usize> {
        self.ordered.then_some(self.frames.len())
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Takes out the queued frames `pick` chooses, keeping the others in order.
    pub fn take(&mut self, mut pick: impl FnMut(&OutFrame) -> bool) -> Vec<OutFrame> {
        self.own = false;
        self.frames.extract_if(.., |f| pick(f)).collect()
    }

    /// Hands each queued frame to `f` in order and keeps the buffers.
    pub fn drain(&mut self, mut f: impl FnMut(&OutFrame)) {
        self.own = false;
        self.ordered = false;
        for fr in self.frames.drain(..) {
            f(&fr);
            self.spare.push(fr.data);
        }
    }
}

/// Which ICMP error to send.
#[derive(Debug, Clone, Copy)]
pub struct IcmpError {
    pub msg_type: u8,
    pub code: u8,
    /// Only meaningful for fragmentation needed (RFC 1191); 0 otherwise.
    pub next_hop_mtu: u16,
}

/// Builds an ICMP error about `frame` (whose IPv4 header starts at `l3`),
/// from `src`, addressed back to the frame's source, with swapped MACs.
pub fn icmp_error(out: &mut Vec<u8>, frame: &[u8], l3: usize, src: u32, err: IcmpError, ident: u16) {
    let orig = &frame[l3..];
    let orig_len = ipv4::Packet::new_lax(orig).map_or(orig.len(), |p| usize::from(p.total_len()).min(orig.len()));
    let quote = orig_len.min(ICMP_ERROR_MAX - ipv4::MIN_HEADER_LEN - icmp::HEADER_LEN);
    let dst = ipv4::Packet::new_lax(orig).map_or(0, |p| p.src_addr());
    out.extend_from_slice(&frame[..l3]);
    ethernet::swap_addresses(out);
    let ip_at = out.len();
    let total = ipv4::MIN_HEADER_LEN + icmp::HEADER_LEN + quote;
    out.resize(ip_at + total, 0);
    ipv4::emit_header(&mut out[ip_at..], src, dst, proto::ICMP, total as u16, 64, ident);
    let icmp_at = ip_at + ipv4::MIN_HEADER_LEN;
    icmp::emit_error_header(&mut out[icmp_at..], err.msg_type, err.code, err.next_hop_mtu);
    out[icmp_at + icmp::HEADER_LEN..].copy_from_slice(&orig[..quote]);
    let c = checksum::checksum(&out[icmp_at..]);
    out[icmp_at + icmp::CHECKSUM_OFFSET..icmp_at + icmp::CHECKSUM_OFFSET + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn icmp_error_is_valid_under_etherparse() {
        let mut frame = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
        etherparse::PacketBuilder::ipv4([100, 64, 0, 10], [198, 51, 100, 53], 1).udp(4000, 53).write(&mut frame, &[7u8; 700]).unwrap();
        let mut out = Vec::new();
        icmp_error(&mut out, &frame, 14, u32::from_be_bytes([100, 64, 0, 1]), IcmpError { msg_type: 11, code: 0, next_hop_mtu: 0 }, 9);
        assert_eq!(&out[0..6], &frame[6..12]);
        assert_eq!(out.len() - 14, 576);
        let p = etherparse::SlicedPacket::from_ethernet(&out).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else { panic!("no ipv4") };
        assert_eq!(ip.header().destination(), [100, 64, 0, 10]);
        assert_eq!(ip.header().header_checksum(), ip.header().to_header().calc_header_checksum());
        let Some(etherparse::TransportSlice::Icmpv4(icmp)) = p.transport else { panic!("no icmp") };
        assert_eq!(icmp.checksum(), icmp.icmp_type().calc_checksum(icmp.payload()));
        assert_eq!(icmp.type_u8(), 11);
    }
}
