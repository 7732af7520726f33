//! ICMPv4 messages (RFC 792): queries carry an identifier, errors quote a datagram.

use crate::checksum;
use crate::error::{need, WireError};
use crate::{get_u16, set_u16};

pub const HEADER_LEN: usize = 8;

mod field {
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
    pub const IDENT: usize = 4;
    pub const SEQ: usize = 6;
    pub const QUOTED: usize = 8;
}

pub mod kind {
    pub const ECHO_REPLY: u8 = 0;
    pub const DEST_UNREACHABLE: u8 = 3;
    pub const SOURCE_QUENCH: u8 = 4;
    pub const REDIRECT: u8 = 5;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
    pub const PARAMETER_PROBLEM: u8 = 12;
    pub const TIMESTAMP: u8 = 13;
    pub const TIMESTAMP_REPLY: u8 = 14;
    pub const INFO_REQUEST: u8 = 15;
    pub const INFO_REPLY: u8 = 16;
    pub const ADDRESS_MASK: u8 = 17;
    pub const ADDRESS_MASK_REPLY: u8 = 18;
}

pub mod unreachable {
    pub const HOST: u8 = 1;
    pub const PORT: u8 = 3;
    pub const FRAG_NEEDED: u8 = 4;
    pub const ADMIN_PROHIBITED: u8 = 13;
}

/// What an ICMP type means to a NAT (RFC 5508 section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A request that opens or uses a mapping keyed by identifier.
    QueryRequest,
    /// The reply to a query: translated back by identifier.
    QueryReply,
    /// An error quoting the datagram that caused it.
    Error,
    /// Redirects, router advertisements and others a NAT does not forward.
    Other,
}

pub fn classify(icmp_type: u8) -> Class {
    use kind::*;
    match icmp_type {
        ECHO_REQUEST | TIMESTAMP | INFO_REQUEST | ADDRESS_MASK => Class::QueryRequest,
        ECHO_REPLY | TIMESTAMP_REPLY | INFO_REPLY | ADDRESS_MASK_REPLY => Class::QueryReply,
        DEST_UNREACHABLE | SOURCE_QUENCH | TIME_EXCEEDED | PARAMETER_PROBLEM => Class::Error,
        _ => Class::Other,
    }
}

/// A view over an ICMP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        need("icmp", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Packet { buffer })
    }

    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    pub fn ident(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::IDENT)
    }

    pub fn seq(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::SEQ)
    }

    /// True when the checksum over the whole message verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(self.buffer.as_ref())) == 0xffff
    }

    /// The datagram an error message quotes.
    pub fn quoted(&self) -> &[u8] {
        &self.buffer.as_ref()[field::QUOTED..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_ident(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::IDENT, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }

    pub fn quoted_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::QUOTED..]
    }
}

/// Writes an error header (type, code, unused word); the caller fills the quote and checksum.
pub fn emit_error_header(buf: &mut [u8], msg_type: u8, code: u8, next_hop_mtu: u16) {
    buf[field::TYPE] = msg_type;
    buf[field::CODE] = code;
    set_u16(buf, field::CHECKSUM, 0);
    set_u16(buf, field::IDENT, 0);
    set_u16(buf, field::SEQ, next_hop_mtu);
}

pub const IDENT_OFFSET: usize = field::IDENT;
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM;

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_request() -> Vec<u8> {
        let mut out = Vec::new();
        etherparse::PacketBuilder::ipv4([100, 64, 0, 10], [198, 51, 100, 1], 64).icmpv4_echo_request(0x4242, 7).write(&mut out, b"ping").unwrap();
        out.split_off(20)
    }

    #[test]
    fn deconstruct_echo_built_by_etherparse() {
        let b = echo_request();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.msg_type(), p.code(), p.ident(), p.seq()), (8, 0, 0x4242, 7));
        assert!(p.verify_checksum());
        assert_eq!(classify(p.msg_type()), Class::QueryRequest);
    }

    #[test]
    fn ident_rewrite_with_full_checksum_verifies() {
        let mut b = echo_request();
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_ident(9);
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert!(p.verify_checksum());
        let (h, _) = etherparse::Icmpv4Header::from_slice(&b).unwrap();
        assert_eq!(h.checksum, h.icmp_type.calc_checksum(&b[8..]));
    }

    #[test]
    fn classifies_errors_and_others() {
        assert_eq!(classify(kind::DEST_UNREACHABLE), Class::Error);
        assert_eq!(classify(kind::TIME_EXCEEDED), Class::Error);
        assert_eq!(classify(kind::REDIRECT), Class::Other);
        assert_eq!(classify(kind::ECHO_REPLY), Class::QueryReply);
    }

    #[test]
    fn truncations_are_errors() {
        let b = echo_request();
        for len in 0..HEADER_LEN {
            assert!(Packet::new_checked(&b[..len]).is_err());
        }
    }
}
