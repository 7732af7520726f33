//! Ethernet II frames with up to two 802.1Q / 802.1ad tags.

use crate::error::{need, WireError};
use crate::get_u16;

pub const HEADER_LEN: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
const MAX_TAGS: usize = 2;

mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: usize = 12;
}

/// The L2 header of a frame as located by [`Frame::new_checked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
    ethertype: u16,
    payload_offset: usize,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Validates the header and any VLAN tags; the payload may be empty.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("ethernet", HEADER_LEN, b.len())?;
        let mut at = field::ETHERTYPE;
        let mut ethertype = get_u16(b, at);
        for _ in 0..MAX_TAGS {
            if ethertype != ETHERTYPE_VLAN && ethertype != ETHERTYPE_QINQ {
                break;
            }
            need("802.1Q tag", at + 6, b.len())?;
            at += 4;
            ethertype = get_u16(b, at);
        }
        Ok(Frame { buffer, ethertype, payload_offset: at + 2 })
    }

    /// The ethertype after any VLAN tags.
    pub fn ethertype(&self) -> u16 {
        self.ethertype
    }

    /// Where the L3 header starts.
    pub fn payload_offset(&self) -> usize {
        self.payload_offset
    }

    pub fn dst_addr(&self) -> [u8; 6] {
        self.buffer.as_ref()[field::DST].try_into().unwrap_or_default()
    }

    pub fn src_addr(&self) -> [u8; 6] {
        self.buffer.as_ref()[field::SRC].try_into().unwrap_or_default()
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// Swaps source and destination MAC addresses in place (for frames answered back).
pub fn swap_addresses(frame: &mut [u8]) {
    if frame.len() >= HEADER_LEN {
        for i in 0..6 {
            frame.swap(i, i + 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNTAGGED: [u8; 16] = [0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00, 0x45, 0x00];

    #[test]
    fn parses_untagged() {
        let f = Frame::new_checked(&UNTAGGED[..]).unwrap();
        assert_eq!(f.ethertype(), ETHERTYPE_IPV4);
        assert_eq!(f.payload_offset(), 14);
        assert_eq!(f.dst_addr(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(f.src_addr(), [2, 0, 0, 0, 0, 2]);
    }

    #[test]
    fn parses_single_and_double_tags() {
        let mut one = UNTAGGED[..12].to_vec();
        one.extend_from_slice(&[0x81, 0x00, 0x00, 0x64, 0x08, 0x00]);
        let f = Frame::new_checked(&one[..]).unwrap();
        assert_eq!((f.ethertype(), f.payload_offset()), (ETHERTYPE_IPV4, 18));
        let mut two = UNTAGGED[..12].to_vec();
        two.extend_from_slice(&[0x88, 0xa8, 0, 10, 0x81, 0x00, 0, 20, 0x08, 0x00]);
        let f = Frame::new_checked(&two[..]).unwrap();
        assert_eq!((f.ethertype(), f.payload_offset()), (ETHERTYPE_IPV4, 22));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let mut one = UNTAGGED[..12].to_vec();
        one.extend_from_slice(&[0x81, 0x00, 0x00, 0x64, 0x08, 0x00]);
        for len in 0..one.len() {
            assert!(Frame::new_checked(&one[..len]).is_err(), "len {len}");
        }
    }

    #[test]
    fn swap_exchanges_macs() {
        let mut f = UNTAGGED;
        swap_addresses(&mut f);
        assert_eq!(&f[0..6], &[2, 0, 0, 0, 0, 2]);
        assert_eq!(&f[6..12], &[2, 0, 0, 0, 0, 1]);
    }
}
