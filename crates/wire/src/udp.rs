//! UDP headers (RFC 768).

use crate::error::{need, Field, WireError};
use crate::{get_u16, set_u16};

pub const HEADER_LEN: usize = 8;

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
}

/// A view over a UDP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Validates the header and that the length field fits the buffer.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_lax(buffer)?;
        let len = usize::from(p.length());
        if len < HEADER_LEN {
            return Err(WireError::Malformed { layer: "udp", field: Field::Length, value: len as u32 });
        }
        need("udp length", len, p.buffer.as_ref().len())?;
        Ok(p)
    }

    /// Validates only the 8-byte header (fragments, ICMP-quoted datagrams).
    pub fn new_lax(buffer: T) -> Result<Self, WireError> {
        need("udp", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Packet { buffer })
    }

    pub fn src_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    pub fn dst_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    pub fn length(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::LENGTH)
    }

    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::SRC_PORT, v);
    }

    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::DST_PORT, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, v);
    }
}

pub const CHECKSUM_OFFSET: usize = field::CHECKSUM;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_a_datagram_built_by_etherparse() {
        let mut out = Vec::new();
        etherparse::PacketBuilder::ipv4([100, 64, 0, 10], [198, 51, 100, 53], 64).udp(5353, 53).write(&mut out, b"abcd").unwrap();
        let p = Packet::new_checked(&out[20..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.length()), (5353, 53, 12));
        assert_ne!(p.checksum(), 0);
    }

    #[test]
    fn length_field_is_checked_only_by_the_strict_view() {
        let mut b = [0u8; 8];
        b[4..6].copy_from_slice(&20u16.to_be_bytes());
        assert!(Packet::new_checked(&b[..]).is_err());
        assert!(Packet::new_lax(&b[..]).is_ok());
        b[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert!(Packet::new_checked(&b[..]).is_err());
        for len in 0..8 {
            assert!(Packet::new_lax(&b[..len]).is_err());
        }
    }
}
