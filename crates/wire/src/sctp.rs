//! SCTP packets (RFC 9260): the common header, bounded iteration over chunks,
//! the INIT and INIT-ACK fixed fields with bounded iteration over their
//! parameters, and the CRC32c checksum (appendix B).
//!
//! A NAT translates addresses only (seed 001): the CRC32c does not cover them,
//! so forwarded packets keep theirs. The CRC is for the packets natrix
//! generates (ABORT, ERROR) and for tests. Iterators take a bound from the
//! caller (`[sctp] max_chunks`, `max_params`) and report malformed lengths as
//! errors; each step also consumes at least 4 bytes.

use crate::error::{need, Field, WireError};
use crate::{get_u16, get_u32, set_u16, set_u32};

pub const HEADER_LEN: usize = 12;
pub const CHUNK_HEADER_LEN: usize = 4;
pub const PARAM_HEADER_LEN: usize = 4;
/// An INIT or INIT-ACK chunk without parameters.
pub const INIT_LEN: usize = 20;

mod field {
    use core::ops::Range;
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const VTAG: usize = 4;
    pub const CHECKSUM: Range<usize> = 8..12;

    // Chunks, relative to the chunk's start.
    pub const CHUNK_TYPE: usize = 0;
    pub const CHUNK_FLAGS: usize = 1;
    pub const CHUNK_LEN: usize = 2;
    pub const CHUNK_HEADER_END: usize = 4;

    // INIT and INIT-ACK.
    pub const INITIATE_TAG: usize = 4;
    pub const A_RWND: usize = 8;
    pub const OUT_STREAMS: usize = 12;
    pub const IN_STREAMS: usize = 14;
    pub const INITIAL_TSN: usize = 16;
    pub const PARAMS: usize = 20;

    // Parameters, relative to the parameter's start.
    pub const PARAM_TYPE: usize = 0;
    pub const PARAM_LEN: usize = 2;
}

/// Chunk types (RFC 9260 section 3.2, RFC 5061 for ASCONF).
pub mod chunk {
    pub const DATA: u8 = 0;
    pub const INIT: u8 = 1;
    pub const INIT_ACK: u8 = 2;
    pub const SACK: u8 = 3;
    pub const HEARTBEAT: u8 = 4;
    pub const HEARTBEAT_ACK: u8 = 5;
    pub const ABORT: u8 = 6;
    pub const SHUTDOWN: u8 = 7;
    pub const SHUTDOWN_ACK: u8 = 8;
    pub const ERROR: u8 = 9;
    pub const COOKIE_ECHO: u8 = 10;
    pub const COOKIE_ACK: u8 = 11;
    pub const SHUTDOWN_COMPLETE: u8 = 14;
    /// RFC 4895: authenticates the chunks after it (an ASCONF's, RFC 5061).
    pub const AUTH: u8 = 15;
    pub const ASCONF_ACK: u8 = 0x80;
    pub const ASCONF: u8 = 0xc1;

    pub fn name(t: u8) -> &'static str {
        match t {
            DATA => "DATA",
            INIT => "INIT",
            INIT_ACK => "INIT_ACK",
            SACK => "SACK",
            HEARTBEAT => "HEARTBEAT",
            HEARTBEAT_ACK => "HEARTBEAT_ACK",
            ABORT => "ABORT",
            SHUTDOWN => "SHUTDOWN",
            SHUTDOWN_ACK => "SHUTDOWN_ACK",
            ERROR => "ERROR",
            COOKIE_ECHO => "COOKIE_ECHO",
            COOKIE_ACK => "COOKIE_ACK",
            SHUTDOWN_COMPLETE => "SHUTDOWN_COMPLETE",
            AUTH => "AUTH",
            ASCONF_ACK => "ASCONF_ACK",
            ASCONF => "ASCONF",
            _ => "UNKNOWN",
        }
    }
}

/// Chunk flags that ABORT, SHUTDOWN-COMPLETE and ERROR share.
pub mod flags {
    /// T: the verification tag is the one the receiver of the packet would
    /// expect from its peer (reflected), not its own (RFC 9260 section 8.5.1).
    pub const T: u8 = 0x01;
    /// M: the chunk comes from a middlebox (seed 001 / draft-ietf-tsvwg-natsupp).
    pub const M: u8 = 0x02;
}

/// INIT and INIT-ACK parameter types (RFC 9260 section 3.3.2, RFC 5061, RFC 3758).
pub mod param {
    pub const IPV4_ADDRESS: u16 = 5;
    pub const IPV6_ADDRESS: u16 = 6;
    pub const STATE_COOKIE: u16 = 7;
    pub const UNRECOGNIZED: u16 = 8;
    pub const COOKIE_PRESERVATIVE: u16 = 9;
    pub const HOST_NAME: u16 = 11;
    pub const SUPPORTED_ADDRESS_TYPES: u16 = 12;
    pub const ECN_CAPABLE: u16 = 0x8000;
    pub const SUPPORTED_EXTENSIONS: u16 = 0x8008;
    pub const FORWARD_TSN_SUPPORTED: u16 = 0xc000;
    pub const ADD_IP_ADDRESS: u16 = 0xc001;
    pub const DELETE_IP_ADDRESS: u16 = 0xc002;
    pub const SET_PRIMARY_ADDRESS: u16 = 0xc004;
    /// draft-ietf-tsvwg-natsupp: "Disable Restart" (INIT, INIT-ACK, ASCONF).
    pub const DISABLE_RESTART: u16 = 0xc007;
    /// draft-ietf-tsvwg-natsupp: "VTags" (ASCONF): correlation id, the internal
    /// host's tag, the remote host's tag.
    pub const VTAGS: u16 = 0xc008;
}

/// Error causes (RFC 9260 section 3.3.10). The two of
/// draft-ietf-tsvwg-natsupp are still "to be confirmed by IANA": this is the
/// one place they are written down.
pub mod cause {
    /// The chunk (INIT, INIT-ACK or ASCONF) that collided follows.
    pub const VTAG_AND_PORT_COLLISION: u16 = 0x00b0;
    /// The packet (IPv4 header included) that matched no state follows.
    pub const MISSING_STATE: u16 = 0x00b1;
    pub const HEADER_LEN: usize = 4;
}

/// CRC32c lookup table: Castagnoli polynomial 0x1EDC6F41, reflected (0x82F63B78).
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0x82f6_3b78 } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

#[inline]
fn crc_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = CRC_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// CRC32c of `data` (RFC 9260 appendix B, RFC 3720 section 12.1): initial
/// value all ones, reflected, final complement. "123456789" gives 0xE3069283.
pub fn crc32c(data: &[u8]) -> u32 {
    !crc_update(!0, data)
}

/// A view over an SCTP packet (common header and chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Validates the common header's length; chunks are checked as they are iterated.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        need("sctp", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Packet { buffer })
    }

    pub fn src_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    pub fn dst_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    pub fn verification_tag(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::VTAG)
    }

    /// The CRC32c value the checksum field holds. The field stores it least
    /// significant byte first (RFC 9260 appendix B), so this reads it so.
    pub fn checksum(&self) -> u32 {
        u32::from_le_bytes(self.buffer.as_ref()[field::CHECKSUM].try_into().expect("4 bytes"))
    }

    /// The CRC32c of the packet with its checksum field taken as zero.
    pub fn compute_checksum(&self) -> u32 {
        let b = self.buffer.as_ref();
        let crc = crc_update(!0, &b[..field::CHECKSUM.start]);
        let crc = crc_update(crc, &[0; 4]);
        !crc_update(crc, &b[field::CHECKSUM.end..])
    }

    pub fn verify_checksum(&self) -> bool {
        self.checksum() == self.compute_checksum()
    }

    /// The chunks, examining at most `max_chunks` of them.
    pub fn chunks(&self, max_chunks: usize) -> Chunks<'_> {
        Chunks { packet: self.buffer.as_ref(), at: HEADER_LEN, left: max_chunks }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::SRC_PORT, v);
    }

    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::DST_PORT, v);
    }

    pub fn set_verification_tag(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::VTAG, v);
    }

    /// Stores a CRC32c value in the checksum field, least significant byte first.
    pub fn set_checksum(&mut self, v: u32) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&v.to_le_bytes());
    }

    /// Computes the CRC32c over the whole buffer and stores it.
    pub fn fill_checksum(&mut self) {
        let c = self.compute_checksum();
        self.set_checksum(c);
    }
}

/// One chunk as it sits in the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    pub chunk_type: u8,
    pub flags: u8,
    /// The length field: header and value, padding excluded.
    pub length: u16,
    /// Offset of the chunk from the start of the SCTP common header.
    pub offset: usize,
    /// The chunk's bytes, header included, padding excluded (`length` of them).
    pub bytes: &'a [u8],
}

impl<'a> Chunk<'a> {
    /// The bytes after the 4-byte chunk header.
    pub fn value(&self) -> &'a [u8] {
        &self.bytes[CHUNK_HEADER_LEN..]
    }

    /// The T bit (ABORT, SHUTDOWN-COMPLETE, ERROR): the tag is reflected.
    pub fn t_bit(&self) -> bool {
        self.flags & flags::T != 0
    }

    /// The M bit (ABORT, ERROR): sent by a middlebox.
    pub fn m_bit(&self) -> bool {
        self.flags & flags::M != 0
    }
}

/// Steps over 4-byte-aligned type-length-value items (chunks, parameters):
/// the item at `at` and where the next one starts. Offsets count from the
/// start of `bytes`; the last item's padding may be missing.
fn tlv(layer: &'static str, bytes: &[u8], at: usize) -> Result<(usize, usize), WireError> {
    need(layer, at + 4, bytes.len())?;
    let len = usize::from(get_u16(bytes, at + 2));
    if len < 4 {
        return Err(WireError::Malformed { layer, field: Field::Length, value: len as u32 });
    }
    need(layer, at + len, bytes.len())?;
    Ok((len, (at + len.next_multiple_of(4)).min(bytes.len())))
}

/// Iterates over the chunks of a packet, at most as many as the caller's bound.
/// Yields an error and stops at the first chunk whose length is below 4 (zero
/// included) or runs past the packet. After `None`, `rest` holds the bytes not
/// examined: not empty when the bound stopped the walk.
#[derive(Debug, Clone)]
pub struct Chunks<'a> {
    packet: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> Chunks<'a> {
    /// The bytes not yet examined.
    pub fn rest(&self) -> &'a [u8] {
        &self.packet[self.at..]
    }
}

impl<'a> Iterator for Chunks<'a> {
    type Item = Result<Chunk<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.packet.len() || self.left == 0 {
            return None;
        }
        let at = self.at;
        match tlv("sctp chunk", self.packet, at) {
            Ok((len, next)) => {
                self.at = next;
                self.left -= 1;
                let b = self.packet;
                Some(Ok(Chunk {
                    chunk_type: b[at + field::CHUNK_TYPE],
                    flags: b[at + field::CHUNK_FLAGS],
                    length: get_u16(b, at + field::CHUNK_LEN),
                    offset: at,
                    bytes: &b[at..at + len],
                }))
            }
            Err(e) => {
                self.left = 0;
                Some(Err(e))
            }
        }
    }
}

/// A view over an INIT or INIT-ACK chunk (RFC 9260 sections 3.3.2, 3.3.3),
/// from its chunk header to its length (padding excluded or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Init<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Init<T> {
    /// Validates the type (INIT or INIT-ACK), that the length field covers the
    /// fixed fields and that the buffer holds it.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("sctp init", INIT_LEN, b.len())?;
        let t = b[field::CHUNK_TYPE];
        if t != chunk::INIT && t != chunk::INIT_ACK {
            return Err(WireError::Malformed { layer: "sctp init", field: Field::Type, value: t.into() });
        }
        let len = usize::from(get_u16(b, field::CHUNK_LEN));
        if len < INIT_LEN {
            return Err(WireError::Malformed { layer: "sctp init", field: Field::Length, value: len as u32 });
        }
        need("sctp init length", len, b.len())?;
        Ok(Init { buffer })
    }

    pub fn chunk_type(&self) -> u8 {
        self.buffer.as_ref()[field::CHUNK_TYPE]
    }

    pub fn length(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CHUNK_LEN)
    }

    pub fn initiate_tag(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::INITIATE_TAG)
    }

    /// Advertised receiver window credit.
    pub fn a_rwnd(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::A_RWND)
    }

    pub fn outbound_streams(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::OUT_STREAMS)
    }

    pub fn inbound_streams(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::IN_STREAMS)
    }

    pub fn initial_tsn(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::INITIAL_TSN)
    }

    /// The parameters, examining at most `max_params` of them.
    pub fn params(&self, max_params: usize) -> Params<'_> {
        let b = &self.buffer.as_ref()[..usize::from(self.length())];
        Params { chunk: b, at: field::PARAMS, left: max_params }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Init<T> {
    pub fn set_initiate_tag(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::INITIATE_TAG, v);
    }
}

/// One parameter of an INIT, INIT-ACK or ASCONF chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param<'a> {
    pub param_type: u16,
    /// The length field: header and value, padding excluded.
    pub length: u16,
    /// Offset of the parameter from the start of its chunk.
    pub offset: usize,
    /// The parameter's bytes, header included, padding excluded.
    pub bytes: &'a [u8],
}

impl<'a> Param<'a> {
    pub fn value(&self) -> &'a [u8] {
        &self.bytes[PARAM_HEADER_LEN..]
    }

    /// The address of an IPv4 Address parameter (type 5, length 8).
    pub fn ipv4_address(&self) -> Option<u32> {
        ipv4_address_param(self.bytes)
    }

    /// The IPv4 address an Add IP or Delete IP parameter (RFC 5061 sections
    /// 4.2.1, 4.2.2) carries after its correlation id; 0.0.0.0 is the
    /// wildcard for "the packet's source address".
    pub fn asconf_ipv4_address(&self) -> Option<u32> {
        match self.param_type {
            param::ADD_IP_ADDRESS | param::DELETE_IP_ADDRESS => self.value().get(4..).and_then(ipv4_address_param),
            _ => None,
        }
    }

    /// The (internal, remote) verification tags of a VTags parameter
    /// (draft-ietf-tsvwg-natsupp): the tag the internal host chose, which
    /// packets towards it carry, and the tag its remote peer chose.
    pub fn vtags(&self) -> Option<(u32, u32)> {
        let v = self.value();
        (self.param_type == param::VTAGS && v.len() >= 12).then(|| (get_u32(v, 4), get_u32(v, 8)))
    }
}

/// An IPv4 Address parameter at the start of `b`: its address.
fn ipv4_address_param(b: &[u8]) -> Option<u32> {
    (b.len() >= 8 && get_u16(b, 0) == param::IPV4_ADDRESS && get_u16(b, 2) == 8).then(|| get_u32(b, 4))
}

/// An ASCONF chunk's fixed part: chunk header and sequence number.
pub const ASCONF_LEN: usize = 8;

/// A view over an ASCONF chunk (RFC 5061 section 3.1.1): the sequence
/// number, then parameters: the address parameter that finds the
/// association, then the requests (Add IP, Delete IP, Set Primary, VTags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asconf<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Asconf<T> {
    /// Validates the type and that the length field covers the sequence
    /// number and lies within the buffer.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("sctp asconf", ASCONF_LEN, b.len())?;
        if b[field::CHUNK_TYPE] != chunk::ASCONF {
            return Err(WireError::Malformed { layer: "sctp asconf", field: Field::Type, value: b[field::CHUNK_TYPE].into() });
        }
        let len = usize::from(get_u16(b, field::CHUNK_LEN));
        if len < ASCONF_LEN {
            return Err(WireError::Malformed { layer: "sctp asconf", field: Field::Length, value: len as u32 });
        }
        need("sctp asconf length", len, b.len())?;
        Ok(Asconf { buffer })
    }

    pub fn sequence_number(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::CHUNK_HEADER_END)
    }

    /// The parameters, the address parameter first, examining at most
    /// `max_params` of them.
    pub fn params(&self, max_params: usize) -> Params<'_> {
        let b = self.buffer.as_ref();
        Params { chunk: &b[..usize::from(get_u16(b, field::CHUNK_LEN))], at: ASCONF_LEN, left: max_params }
    }
}

/// Iterates over a chunk's parameters, as `Chunks` does over chunks.
#[derive(Debug, Clone)]
pub struct Params<'a> {
    chunk: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> Params<'a> {
    /// The bytes not yet examined.
    pub fn rest(&self) -> &'a [u8] {
        &self.chunk[self.at..]
    }
}

impl<'a> Iterator for Params<'a> {
    type Item = Result<Param<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.chunk.len() || self.left == 0 {
            return None;
        }
        let at = self.at;
        match tlv("sctp parameter", self.chunk, at) {
            Ok((len, next)) => {
                self.at = next;
                self.left -= 1;
                let b = self.chunk;
                Some(Ok(Param { param_type: get_u16(b, at + field::PARAM_TYPE), length: get_u16(b, at + field::PARAM_LEN), offset: at, bytes: &b[at..at + len] }))
            }
            Err(e) => {
                self.left = 0;
                Some(Err(e))
            }
        }
    }
}

/// Writes a common header with a zero checksum (fill it once the chunks are written).
pub fn emit_header(buf: &mut [u8], src_port: u16, dst_port: u16, verification_tag: u32) -> Result<(), WireError> {
    need("sctp emit", HEADER_LEN, buf.len())?;
    set_u16(buf, field::SRC_PORT, src_port);
    set_u16(buf, field::DST_PORT, dst_port);
    set_u32(buf, field::VTAG, verification_tag);
    buf[field::CHECKSUM].fill(0);
    Ok(())
}

/// Writes a chunk header at the start of `buf`; `length` counts the header and
/// the value, not the padding, which the caller zeroes.
pub fn emit_chunk_header(buf: &mut [u8], chunk_type: u8, flags: u8, length: u16) -> Result<(), WireError> {
    need("sctp chunk emit", CHUNK_HEADER_LEN, buf.len())?;
    buf[field::CHUNK_TYPE] = chunk_type;
    buf[field::CHUNK_FLAGS] = flags;
    set_u16(buf, field::CHUNK_LEN, length);
    Ok(())
}

/// Writes an error cause header (RFC 9260 section 3.3.10) at the start of
/// `buf`; `length` counts the header and the cause's information, not the
/// padding, which the caller zeroes.
pub fn emit_cause_header(buf: &mut [u8], code: u16, length: u16) -> Result<(), WireError> {
    need("sctp cause emit", cause::HEADER_LEN, buf.len())?;
    set_u16(buf, 0, code);
    set_u16(buf, 2, length);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    // scapy 2.8.0: IP(src="192.0.2.1", dst="198.51.100.7", ttl=64, id=1)/SCTP(sport=5000, dport=38412, tag=0)
    //   /SCTPChunkInit(init_tag=0x11223344, a_rwnd=106496, n_out_streams=10, n_in_streams=65535, init_tsn=0x55667788,
    //   params=[SCTPChunkParamIPv4Addr(addr="192.0.2.1"), SCTPChunkParamSupportedAddrTypes(addr_type_list=["IPv4"]), SCTPChunkParamECNCapable()])
    const INIT: &str = "450000480001000040848df5c0000201c63364071388960c0000000044c9947a01000028112233440001a000000affff5566778800050008c0000201000c00060005000080000004";
    // scapy: IP(src="192.0.2.1", dst="198.51.100.7", ttl=64, id=2)/SCTP(sport=5000, dport=38412, tag=0x01020304)
    //   /SCTPChunkData(tsn=1, stream_id=0, stream_seq=0, proto_id=0, data=b"abc")/SCTPChunkSACK(cumul_tsn_ack=9, a_rwnd=4096)
    const DATA_SACK: &str = "450000440002000040848df8c0000201c63364071388960c010203042e47e427000000130000000100000000000000006162630003000010000000090000100000000000";
    // scapy: IP(src="192.0.2.1", dst="198.51.100.7", ttl=64, id=3)/SCTP(sport=5000, dport=38412, tag=0x0a0b0c0d)/SCTPChunkAbort(TCB=1)
    const ABORT_T: &str = "450000240003000040848e17c0000201c63364071388960c0a0b0c0d3013f98706010004";

    // RFC 3720 section B.4: 32 bytes of zeros, of ones, incrementing, decrementing,
    // and an iSCSI read command PDU; the CRC's bytes as they go on the wire.
    #[test]
    fn rfc3720_test_vectors() {
        let inc: Vec<u8> = (0..32).collect();
        let dec: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&[0; 32]).to_le_bytes(), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(crc32c(&[0xff; 32]).to_le_bytes(), [0x43, 0xab, 0xa8, 0x62]);
        assert_eq!(crc32c(&inc).to_le_bytes(), [0x4e, 0x79, 0xdd, 0x46]);
        assert_eq!(crc32c(&dec).to_le_bytes(), [0x5c, 0xdb, 0x3f, 0x11]);
        let mut pdu = [0u8; 48];
        pdu[0] = 0x01;
        pdu[1] = 0xc0;
        pdu[16..20].copy_from_slice(&[0x14, 0, 0, 0]);
        pdu[20..24].copy_from_slice(&[0, 0, 0x04, 0]);
        pdu[24..28].copy_from_slice(&[0, 0, 0, 0x14]);
        pdu[28..32].copy_from_slice(&[0, 0, 0, 0x18]);
        pdu[32..36].copy_from_slice(&[0x28, 0, 0, 0]);
        pdu[40..44].copy_from_slice(&[0x02, 0, 0, 0]);
        assert_eq!(crc32c(&pdu).to_le_bytes(), [0x56, 0x3a, 0x96, 0xd9]);
        // The common check value.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn deconstruct_an_init_built_by_scapy() {
        let b = hex(INIT);
        let p = Packet::new_checked(&b[20..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.verification_tag()), (5000, 38412, 0));
        assert_eq!(&b[28..32], &[0x44, 0xc9, 0x94, 0x7a], "scapy's CRC bytes");
        assert_eq!(p.checksum(), 0x7a94_c944);
        assert!(p.verify_checksum());
        let chunks: Vec<Chunk> = p.chunks(8).map(|c| c.unwrap()).collect();
        assert_eq!(chunks.len(), 1);
        let c = chunks[0];
        assert_eq!((c.chunk_type, c.flags, c.length, c.offset), (chunk::INIT, 0, 40, 12));
        assert_eq!(chunk::name(c.chunk_type), "INIT");
        let init = Init::new_checked(c.bytes).unwrap();
        assert_eq!(init.initiate_tag(), 0x1122_3344);
        assert_eq!(init.a_rwnd(), 106_496);
        assert_eq!((init.outbound_streams(), init.inbound_streams()), (10, 65535));
        assert_eq!(init.initial_tsn(), 0x5566_7788);
        let params: Vec<(u16, u16, usize, Vec<u8>)> = init.params(25).map(|p| p.unwrap()).map(|p| (p.param_type, p.length, p.offset, p.value().to_vec())).collect();
        assert_eq!(params, vec![(param::IPV4_ADDRESS, 8, 20, vec![192, 0, 2, 1]), (param::SUPPORTED_ADDRESS_TYPES, 6, 28, vec![0, 5]), (param::ECN_CAPABLE, 4, 36, vec![]),]);
        // The bound stops the walk; the rest is left unexamined.
        let mut it = init.params(1);
        assert!(it.next().unwrap().is_ok());
        assert!(it.next().is_none());
        assert_eq!(it.rest().len(), 12);
    }

    #[test]
    fn chunks_with_padding_and_flags() {
        let b = hex(DATA_SACK);
        let p = Packet::new_checked(&b[20..]).unwrap();
        assert!(p.verify_checksum());
        let c: Vec<Chunk> = p.chunks(2).map(|c| c.unwrap()).collect();
        assert_eq!((c[0].chunk_type, c[0].flags, c[0].length, c[0].offset), (chunk::DATA, 0, 19, 12));
        assert_eq!(&c[0].value()[12..], b"abc");
        assert_eq!((c[1].chunk_type, c[1].length, c[1].offset), (chunk::SACK, 16, 32));
        let mut it = p.chunks(1);
        assert_eq!(it.next().unwrap().unwrap().chunk_type, chunk::DATA);
        assert!(it.next().is_none());
        assert_eq!(it.rest().len(), 16, "the SACK was not examined");
        let b = hex(ABORT_T);
        let p = Packet::new_checked(&b[20..]).unwrap();
        assert!(p.verify_checksum());
        let a = p.chunks(2).next().unwrap().unwrap();
        assert_eq!(a.chunk_type, chunk::ABORT);
        assert!(a.t_bit() && !a.m_bit());
    }

    // scapy: SCTP(sport=5000, dport=38412, tag=0x55667788)/SCTPChunkAddressConf(seq=5, params=[
    //   SCTPChunkParamIPv4Addr(addr="100.64.0.10"), SCTPChunkParamAddIPAddr(correlation_id=1, addr_type=5, addr="0.0.0.0"),
    //   SCTPChunkParamDelIPAddr(correlation_id=2, addr_type=5, addr="198.51.100.9")]): the chunk, then by hand a
    //   VTags parameter (scapy has none): c008 0010, correlation 3, tags 0x11223344 and 0x55667788; length 48 -> 64.
    const ASCONF: &str = "c100004000000005000500086440000ac0010010000000010005000800000000c00200100000000200050008c6336409c0080010000000031122334455667788";

    #[test]
    fn asconf_parameters_addresses_and_vtags() {
        let b = hex(ASCONF);
        let a = Asconf::new_checked(&b[..]).unwrap();
        assert_eq!(a.sequence_number(), 5);
        let p: Vec<Param> = a.params(25).map(|p| p.unwrap()).collect();
        assert_eq!(p.iter().map(|p| p.param_type).collect::<Vec<_>>(), [param::IPV4_ADDRESS, param::ADD_IP_ADDRESS, param::DELETE_IP_ADDRESS, param::VTAGS]);
        assert_eq!(p[0].ipv4_address(), Some(0x6440_000a));
        assert_eq!(p[1].asconf_ipv4_address(), Some(0), "the wildcard");
        assert_eq!(p[2].asconf_ipv4_address(), Some(0xc633_6409));
        assert_eq!(p[3].vtags(), Some((0x1122_3344, 0x5566_7788)));
        assert_eq!((p[0].vtags(), p[3].asconf_ipv4_address(), p[1].ipv4_address()), (None, None, None));
        assert_eq!(a.params(2).count(), 2, "the bound holds");
        let mut short = b.clone();
        short[2..4].copy_from_slice(&7u16.to_be_bytes());
        assert!(Asconf::new_checked(&short[..]).is_err());
        short[2..4].copy_from_slice(&65u16.to_be_bytes());
        assert!(Asconf::new_checked(&short[..]).is_err(), "length past the buffer");
        short[0] = chunk::ASCONF_ACK;
        assert!(Asconf::new_checked(&short[..]).is_err());
        for len in 0..b.len() {
            if let Ok(a) = Asconf::new_checked(&b[..len]) {
                let _ = a.params(usize::MAX).count();
            }
        }
    }

    #[test]
    fn emit_an_abort_as_scapy_builds_it() {
        let mut out = [0u8; 16];
        emit_header(&mut out, 5000, 38412, 0x0a0b_0c0d).unwrap();
        emit_chunk_header(&mut out[12..], chunk::ABORT, flags::T, 4).unwrap();
        let mut p = Packet::new_checked(&mut out[..]).unwrap();
        p.fill_checksum();
        assert_eq!(&out[..], &hex(ABORT_T)[20..]);
        assert!(emit_header(&mut out[..11], 1, 2, 3).is_err());
        assert!(emit_chunk_header(&mut out[..3], 1, 2, 3).is_err());
    }

    #[test]
    fn malformed_chunk_and_parameter_lengths_are_errors() {
        let mut b = hex(DATA_SACK)[20..].to_vec();
        // The SACK's length set to 0, then past the packet, then 3.
        for (len, e) in [
            (0u16, WireError::Malformed { layer: "sctp chunk", field: Field::Length, value: 0 }),
            (3, WireError::Malformed { layer: "sctp chunk", field: Field::Length, value: 3 }),
            (17, WireError::Truncated { layer: "sctp chunk", needed: 49, actual: 48 }),
        ] {
            b[34..36].copy_from_slice(&len.to_be_bytes());
            let p = Packet::new_checked(&b[..]).unwrap();
            let mut it = p.chunks(8);
            assert!(it.next().unwrap().is_ok());
            assert_eq!(it.next(), Some(Err(e)));
            assert_eq!(it.next(), None);
        }
        assert_eq!(WireError::Malformed { layer: "sctp chunk", field: Field::Length, value: 0 }.to_string(), "sctp chunk: invalid length 0");
        let mut b = hex(INIT)[32..].to_vec();
        b[22..24].copy_from_slice(&0u16.to_be_bytes());
        let init = Init::new_checked(&b[..]).unwrap();
        let mut it = init.params(25);
        assert_eq!(it.next(), Some(Err(WireError::Malformed { layer: "sctp parameter", field: Field::Length, value: 0 })));
        assert_eq!(it.next(), None);
        b[0] = chunk::DATA;
        assert_eq!(Init::new_checked(&b[..]), Err(WireError::Malformed { layer: "sctp init", field: Field::Type, value: 0 }));
        b[0] = chunk::INIT_ACK;
        b[2..4].copy_from_slice(&16u16.to_be_bytes());
        assert!(Init::new_checked(&b[..]).is_err());
    }

    #[test]
    fn every_truncation_is_an_error() {
        for fx in [INIT, DATA_SACK, ABORT_T] {
            let b = hex(fx);
            let s = &b[20..];
            for len in 0..s.len() {
                let cut = &s[..len];
                match Packet::new_checked(cut) {
                    Err(_) => assert!(len < HEADER_LEN),
                    Ok(p) => {
                        assert!(!p.verify_checksum(), "{fx} len {len}");
                        // Some chunk is cut: the walk ends in an error, unless the
                        // cut falls at a chunk's end or in its padding.
                        let mut n = 0;
                        let mut failed = false;
                        for c in p.chunks(usize::MAX) {
                            n += 1;
                            assert!(n <= len / 4 + 1);
                            if let Ok(c) = c {
                                if c.chunk_type == chunk::INIT {
                                    let _ = Init::new_checked(c.bytes).map(|i| i.params(usize::MAX).count());
                                }
                            } else {
                                failed = true;
                            }
                        }
                        let boundary = p.chunks(usize::MAX).filter_map(Result::ok).any(|c| {
                            let end = c.offset + usize::from(c.length);
                            end <= len && len <= end.next_multiple_of(4)
                        });
                        assert!(failed || boundary || len == HEADER_LEN, "{fx} len {len}");
                    }
                }
            }
            // The INIT chunk cut anywhere fails its view.
            if fx == INIT {
                let c = &s[12..];
                for len in 0..c.len() {
                    assert!(Init::new_checked(&c[..len]).is_err(), "len {len}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn chunks_and_params_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..160), max in 0usize..64) {
            if let Ok(p) = Packet::new_checked(&b[..]) {
                let _ = p.verify_checksum();
                let mut n = 0;
                for c in p.chunks(max) {
                    n += 1;
                    if let Ok(c) = c {
                        proptest::prop_assert!(c.bytes.len() >= CHUNK_HEADER_LEN);
                        if let Ok(i) = Init::new_checked(c.bytes) {
                            proptest::prop_assert!(i.params(max).count() <= max);
                        }
                    }
                }
                proptest::prop_assert!(n <= max && n <= b.len() / 4 + 1);
            }
            let _ = Init::new_checked(&b[..]).map(|i| i.params(usize::MAX).count());
        }
    }
}
