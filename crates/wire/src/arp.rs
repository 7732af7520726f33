//! ARP for IPv4 over Ethernet (RFC 826): the only kind natrix speaks, to
//! answer for its own addresses and to find next hops.

use crate::error::{need, Field, WireError};
use crate::{get_u16, get_u32, set_u16, set_u32};

/// Hardware type, protocol type, lengths, operation, two address pairs.
pub const PACKET_LEN: usize = 28;
pub const OP_REQUEST: u16 = 1;
pub const OP_REPLY: u16 = 2;
const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;

mod field {
    use core::ops::Range;
    pub const HTYPE: usize = 0;
    pub const PTYPE: usize = 2;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: usize = 6;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: usize = 14;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: usize = 24;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Accepts only Ethernet/IPv4 ARP.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("arp", PACKET_LEN, b.len())?;
        if get_u16(b, field::HTYPE) != HTYPE_ETHERNET || get_u16(b, field::PTYPE) != PTYPE_IPV4 || b[field::HLEN] != 6 || b[field::PLEN] != 4 {
            return Err(WireError::Malformed { layer: "arp", field: Field::Version, value: u32::from(get_u16(b, field::HTYPE)) });
        }
        Ok(Packet { buffer })
    }

    pub fn operation(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::OPER)
    }

    pub fn sender_mac(&self) -> [u8; 6] {
        self.buffer.as_ref()[field::SHA].try_into().unwrap_or_default()
    }

    pub fn sender_addr(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SPA)
    }

    pub fn target_addr(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::TPA)
    }
}

/// Writes an ARP packet into `buf` (at least `PACKET_LEN` bytes).
pub fn emit(buf: &mut [u8], op: u16, sender: ([u8; 6], u32), target: ([u8; 6], u32)) {
    set_u16(buf, field::HTYPE, HTYPE_ETHERNET);
    set_u16(buf, field::PTYPE, PTYPE_IPV4);
    buf[field::HLEN] = 6;
    buf[field::PLEN] = 4;
    set_u16(buf, field::OPER, op);
    buf[field::SHA].copy_from_slice(&sender.0);
    set_u32(buf, field::SPA, sender.1);
    buf[field::THA].copy_from_slice(&target.0);
    set_u32(buf, field::TPA, target.1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emitted_request_reads_back() {
        let mut b = [0u8; PACKET_LEN];
        emit(&mut b, OP_REQUEST, ([2, 0, 0, 0, 0, 1], 0xc633_6401), ([0; 6], 0xc633_640b));
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.operation(), OP_REQUEST);
        assert_eq!(p.sender_mac(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(p.sender_addr(), 0xc633_6401);
        assert_eq!(p.target_addr(), 0xc633_640b);
        // RFC 826 layout: hardware type 1, protocol 0x0800, lengths 6 and 4.
        assert_eq!(&b[..6], &[0, 1, 8, 0, 6, 4]);
    }

    #[test]
    fn non_ethernet_ipv4_arp_is_refused() {
        let mut b = [0u8; PACKET_LEN];
        emit(&mut b, OP_REQUEST, ([0; 6], 0), ([0; 6], 0));
        b[1] = 6; // IEEE 802 hardware type
        assert!(Packet::new_checked(&b[..]).is_err());
        assert!(Packet::new_checked(&b[..20]).is_err());
    }
}
