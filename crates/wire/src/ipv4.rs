//! IPv4 headers (RFC 791), options included.

use crate::checksum;
use crate::error::{need, Field, WireError};
use crate::{get_u16, get_u32, set_u16, set_u32};

pub const MIN_HEADER_LEN: usize = 20;

mod field {
    pub const VER_IHL: usize = 0;
    pub const TOTAL_LEN: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

/// Field offsets for code that patches a header in place with incremental
/// checksum updates (RFC 1624) rather than through a view.
pub const IDENT_OFFSET: usize = field::IDENT;
pub const FLAGS_FRAG_OFFSET: usize = field::FLAGS_FRAG;
/// Don't fragment, in the 16-bit word at `FLAGS_FRAG_OFFSET`.
pub const DONT_FRAGMENT: u16 = FLAG_DF;
pub const TTL_OFFSET: usize = field::TTL;
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM;
pub const SRC_OFFSET: usize = field::SRC;
pub const DST_OFFSET: usize = field::DST;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// A view over an IPv4 header and the datagram bytes that follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Validates version, header length and total length against the buffer.
    /// Bytes past the total length (Ethernet padding) are allowed and ignored.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_lax(buffer)?;
        let b = p.buffer.as_ref();
        let total = usize::from(p.total_len());
        if total < p.header_len() {
            return Err(WireError::Malformed { layer: "ipv4", field: Field::TotalLength, value: total as u32 });
        }
        need("ipv4 total length", total, b.len())?;
        Ok(p)
    }

    /// Validates only the header itself: for the datagram quoted inside an ICMP
    /// error, whose total length may exceed what the error carries.
    pub fn new_lax(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("ipv4", MIN_HEADER_LEN, b.len())?;
        let version = b[field::VER_IHL] >> 4;
        if version != 4 {
            return Err(WireError::Malformed { layer: "ipv4", field: Field::Version, value: version.into() });
        }
        let ihl = usize::from(b[field::VER_IHL] & 0x0f) * 4;
        if ihl < MIN_HEADER_LEN {
            return Err(WireError::Malformed { layer: "ipv4", field: Field::HeaderLength, value: ihl as u32 });
        }
        need("ipv4 options", ihl, b.len())?;
        Ok(Packet { buffer })
    }

    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    pub fn total_len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::TOTAL_LEN)
    }

    pub fn ident(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::IDENT)
    }

    pub fn dont_frag(&self) -> bool {
        get_u16(self.buffer.as_ref(), field::FLAGS_FRAG) & FLAG_DF != 0
    }

    pub fn more_frags(&self) -> bool {
        get_u16(self.buffer.as_ref(), field::FLAGS_FRAG) & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (get_u16(self.buffer.as_ref(), field::FLAGS_FRAG) & FRAG_OFFSET_MASK) << 3
    }

    /// True for any piece of a fragmented datagram, first included.
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    pub fn src_addr(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SRC)
    }

    pub fn dst_addr(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DST)
    }

    /// True when the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(&self.buffer.as_ref()[..self.header_len()])) == 0xffff
    }

    /// The L4 bytes: up to the total length, or to the end of the buffer if shorter (lax views).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = usize::from(self.total_len()).min(b.len()).max(self.header_len());
        &b[self.header_len()..end]
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_src_addr(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::SRC, v);
    }

    pub fn set_dst_addr(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::DST, v);
    }

    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    /// Recomputes the header checksum from scratch.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let sum = checksum::checksum(&self.buffer.as_ref()[..self.header_len()]);
        self.set_checksum(sum);
    }

    /// Decrements the TTL and patches the checksum incrementally (RFC 1624).
    pub fn decrement_ttl(&mut self) {
        let old = get_u16(self.buffer.as_ref(), field::TTL);
        self.buffer.as_mut()[field::TTL] -= 1;
        let new = get_u16(self.buffer.as_ref(), field::TTL);
        let c = checksum::Delta::from_u16(old, new).apply(self.checksum());
        self.set_checksum(c);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        let end = usize::from(self.total_len()).min(self.buffer.as_ref().len()).max(hl);
        &mut self.buffer.as_mut()[hl..end]
    }
}

/// Writes a minimal 20-byte header (no options, DF clear) with a valid checksum.
pub fn emit_header(buf: &mut [u8], src: u32, dst: u32, protocol: u8, total_len: u16, ttl: u8, ident: u16) {
    buf[field::VER_IHL] = 0x45;
    buf[1] = 0;
    set_u16(buf, field::TOTAL_LEN, total_len);
    set_u16(buf, field::IDENT, ident);
    set_u16(buf, field::FLAGS_FRAG, 0);
    buf[field::TTL] = ttl;
    buf[field::PROTOCOL] = protocol;
    set_u32(buf, field::SRC, src);
    set_u32(buf, field::DST, dst);
    set_u16(buf, field::CHECKSUM, 0);
    let c = checksum::checksum(&buf[..MIN_HEADER_LEN]);
    set_u16(buf, field::CHECKSUM, c);
}

#[cfg(test)]
mod tests {
    use super::*;

    // 20-byte header + 8 bytes of UDP, from 100.64.0.10 to 198.51.100.53, TTL 64, id 0x1234.
    fn sample() -> Vec<u8> {
        let mut b = vec![0u8; 28];
        emit_header(&mut b, 0x6440_000a, 0xc633_6435, 17, 28, 64, 0x1234);
        b
    }

    #[test]
    fn deconstruct() {
        let b = sample();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 28);
        assert_eq!(p.ident(), 0x1234);
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), 17);
        assert_eq!(p.src_addr(), 0x6440_000a);
        assert_eq!(p.dst_addr(), 0xc633_6435);
        assert!(p.verify_checksum());
        assert_eq!(p.payload().len(), 8);
        assert!(!p.is_fragment());
    }

    #[test]
    fn checksum_agrees_with_etherparse() {
        let b = sample();
        let (h, _) = etherparse::Ipv4Header::from_slice(&b).unwrap();
        assert_eq!(h.header_checksum, h.calc_header_checksum());
        assert_eq!(h.header_checksum, Packet::new_checked(&b[..]).unwrap().checksum());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = sample();
        for len in 0..b.len() {
            assert!(Packet::new_checked(&b[..len]).is_err(), "len {len}");
        }
        // The lax view accepts a header whose payload was cut short.
        assert!(Packet::new_lax(&b[..20]).is_ok());
    }

    #[test]
    fn rejects_bad_version_ihl_and_total_length() {
        let mut b = sample();
        b[0] = 0x65;
        assert!(matches!(Packet::new_checked(&b[..]), Err(WireError::Malformed { field: Field::Version, .. })));
        b[0] = 0x44;
        assert!(matches!(Packet::new_checked(&b[..]), Err(WireError::Malformed { field: Field::HeaderLength, .. })));
        b[0] = 0x45;
        b[2..4].copy_from_slice(&19u16.to_be_bytes());
        assert!(matches!(Packet::new_checked(&b[..]), Err(WireError::Malformed { field: Field::TotalLength, .. })));
        b[2..4].copy_from_slice(&29u16.to_be_bytes());
        assert!(matches!(Packet::new_checked(&b[..]), Err(WireError::Truncated { .. })));
    }

    #[test]
    fn options_move_the_payload() {
        let mut b = vec![0u8; 32];
        emit_header(&mut b, 1, 2, 17, 32, 64, 0);
        b[0] = 0x46; // 24-byte header: one 4-byte option (NOPs + EOL)
        b[20..24].copy_from_slice(&[1, 1, 1, 0]);
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum();
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.payload().len(), 8);
        assert!(p.verify_checksum());
    }

    #[test]
    fn ttl_decrement_keeps_checksum_valid() {
        let mut b = sample();
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.decrement_ttl();
        assert_eq!(p.ttl(), 63);
        assert!(p.verify_checksum());
    }

    #[test]
    fn fragment_fields() {
        let mut b = sample();
        b[6..8].copy_from_slice(&(0x2000u16 | 185).to_be_bytes());
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.more_frags() && p.is_fragment());
        assert_eq!(p.frag_offset(), 1480);
    }
}
