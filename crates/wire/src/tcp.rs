//! TCP headers (RFC 9293): ports, flags and the checksum field.

use crate::error::{need, Field, WireError};
use crate::{get_u16, get_u32, set_u16, set_u32};

pub const MIN_HEADER_LEN: usize = 20;

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ: usize = 4;
    pub const ACK: usize = 8;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: usize = 14;
    pub const CHECKSUM: usize = 16;
    pub const URGENT: usize = 18;
}

pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
}

/// A view over a TCP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Validates the fixed header and the data offset.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("tcp", MIN_HEADER_LEN, b.len())?;
        let off = usize::from(b[field::DATA_OFF] >> 4) * 4;
        if off < MIN_HEADER_LEN {
            return Err(WireError::Malformed { layer: "tcp", field: Field::DataOffset, value: off as u32 });
        }
        need("tcp options", off, b.len())?;
        Ok(Packet { buffer })
    }

    pub fn src_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    pub fn dst_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    pub fn seq_number(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SEQ)
    }

    pub fn ack_number(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::ACK)
    }

    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::DATA_OFF] >> 4) * 4
    }

    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    pub fn syn(&self) -> bool {
        self.flags() & flags::SYN != 0
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

/// Offset of the checksum field, for partial headers quoted in ICMP errors.
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM;

/// What a header without options written by `emit_header` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
}

/// Writes a 20-byte header (no options, urgent pointer 0) into `buf`,
/// checksum `checksum` (the caller sums the pseudo-header and segment).
pub fn emit_header(buf: &mut [u8], h: &Header, checksum: u16) {
    set_u16(buf, field::SRC_PORT, h.src_port);
    set_u16(buf, field::DST_PORT, h.dst_port);
    set_u32(buf, field::SEQ, h.seq);
    set_u32(buf, field::ACK, h.ack);
    buf[field::DATA_OFF] = (MIN_HEADER_LEN as u8 / 4) << 4;
    buf[field::FLAGS] = h.flags;
    set_u16(buf, field::WINDOW, h.window);
    set_u16(buf, field::CHECKSUM, checksum);
    set_u16(buf, field::URGENT, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_a_syn_built_by_etherparse() {
        let b = etherparse::PacketBuilder::ipv4([100, 64, 0, 10], [198, 51, 100, 80], 64).tcp(40000, 80, 7, 1024).syn();
        let mut out = Vec::new();
        b.write(&mut out, &[]).unwrap();
        let p = Packet::new_checked(&out[20..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port()), (40000, 80));
        assert_eq!(p.seq_number(), 7);
        assert!(p.syn());
        assert_eq!(p.flags() & flags::ACK, 0);
        assert_eq!(p.header_len(), 20);
    }

    #[test]
    fn an_emitted_header_reads_back_under_etherparse() {
        let h = Header { src_port: 80, dst_port: 40000, seq: 0, ack: 1001, flags: flags::RST | flags::ACK, window: 0 };
        let mut b = [0xffu8; MIN_HEADER_LEN];
        emit_header(&mut b, &h, 0x1234);
        let t = etherparse::TcpHeaderSlice::from_slice(&b).unwrap();
        assert_eq!((t.source_port(), t.destination_port(), t.sequence_number(), t.acknowledgment_number()), (80, 40000, 0, 1001));
        assert!(t.rst() && t.ack() && !t.syn() && !t.fin() && !t.psh());
        assert_eq!((t.window_size(), t.checksum(), t.urgent_pointer(), t.data_offset()), (0, 0x1234, 0, 5));
    }

    #[test]
    fn every_truncation_and_bad_offset_is_an_error() {
        let mut b = [0u8; 24];
        b[12] = 6 << 4;
        assert!(Packet::new_checked(&b[..]).is_ok());
        for len in 0..24 {
            assert!(Packet::new_checked(&b[..len]).is_err(), "len {len}");
        }
        b[12] = 4 << 4;
        assert!(Packet::new_checked(&b[..]).is_err());
    }
}
