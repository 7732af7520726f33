//! Port Control Protocol messages (RFC 6887): the common request and
//! response headers (section 7), MAP and PEER opcode data (sections 11.1
//! and 12.1), options (section 7.3) and the option bodies natrix knows
//! (THIRD_PARTY, PREFER_FAILURE, FILTER: section 13).
//!
//! Views validate lengths once in `new_checked`, so no getter can panic.
//! Addresses are the 128-bit fields of the wire format; IPv4 addresses are
//! carried IPv4-mapped (`::ffff:a.b.c.d`, RFC 6887 section 5).

use crate::error::{need, Field, WireError};
use crate::{get_u16, get_u32, set_u16, set_u32};

pub const VERSION: u8 = 2;
/// The port a PCP server listens on.
pub const SERVER_PORT: u16 = 5351;
/// The port unsolicited ANNOUNCE messages go to (RFC 6887 section 14.1.3).
pub const CLIENT_PORT: u16 = 5350;
/// Both headers are 24 octets.
pub const HEADER_LEN: usize = 24;
/// No PCP message is longer (section 7).
pub const MAX_LEN: usize = 1100;
pub const MAP_LEN: usize = 36;
pub const PEER_LEN: usize = 56;
pub const NONCE_LEN: usize = 12;
/// The R bit of the second octet: set in responses.
pub const RESPONSE_BIT: u8 = 0x80;

pub mod opcode {
    pub const ANNOUNCE: u8 = 0;
    pub const MAP: u8 = 1;
    pub const PEER: u8 = 2;

    pub fn name(op: u8) -> &'static str {
        match op {
            ANNOUNCE => "ANNOUNCE",
            MAP => "MAP",
            PEER => "PEER",
            _ => "UNKNOWN",
        }
    }
}

/// Result codes (section 7.4).
pub mod result {
    pub const SUCCESS: u8 = 0;
    pub const UNSUPP_VERSION: u8 = 1;
    pub const NOT_AUTHORIZED: u8 = 2;
    pub const MALFORMED_REQUEST: u8 = 3;
    pub const UNSUPP_OPCODE: u8 = 4;
    pub const UNSUPP_OPTION: u8 = 5;
    pub const MALFORMED_OPTION: u8 = 6;
    pub const NETWORK_FAILURE: u8 = 7;
    pub const NO_RESOURCES: u8 = 8;
    pub const UNSUPP_PROTOCOL: u8 = 9;
    pub const USER_EX_QUOTA: u8 = 10;
    pub const CANNOT_PROVIDE_EXTERNAL: u8 = 11;
    pub const ADDRESS_MISMATCH: u8 = 12;
    pub const EXCESSIVE_REMOTE_PEERS: u8 = 13;

    pub const NAMES: [&str; 14] = [
        "SUCCESS",
        "UNSUPP_VERSION",
        "NOT_AUTHORIZED",
        "MALFORMED_REQUEST",
        "UNSUPP_OPCODE",
        "UNSUPP_OPTION",
        "MALFORMED_OPTION",
        "NETWORK_FAILURE",
        "NO_RESOURCES",
        "UNSUPP_PROTOCOL",
        "USER_EX_QUOTA",
        "CANNOT_PROVIDE_EXTERNAL",
        "ADDRESS_MISMATCH",
        "EXCESSIVE_REMOTE_PEERS",
    ];

    pub fn name(code: u8) -> &'static str {
        NAMES.get(usize::from(code)).copied().unwrap_or("UNKNOWN")
    }

    /// Errors caused by resources that may come back soon (section 7.4);
    /// every other error is a long-lifetime one.
    pub fn is_short_lifetime(code: u8) -> bool {
        matches!(code, NETWORK_FAILURE | NO_RESOURCES | USER_EX_QUOTA)
    }

    /// Errors that answer a request that did not parse: their response
    /// header carries the last 96 bits of the request's client address
    /// field where others have zeros (section 7.2).
    pub fn means_unparsed(code: u8) -> bool {
        matches!(code, UNSUPP_VERSION | MALFORMED_REQUEST | UNSUPP_OPCODE | MALFORMED_OPTION)
    }
}

/// Option codes (section 7.3, 13); codes below 128 are mandatory to process.
pub mod option {
    pub const THIRD_PARTY: u8 = 1;
    pub const PREFER_FAILURE: u8 = 2;
    pub const FILTER: u8 = 3;
    pub const HEADER_LEN: usize = 4;
    pub const THIRD_PARTY_LEN: usize = 16;
    pub const FILTER_LEN: usize = 20;

    pub fn is_mandatory(code: u8) -> bool {
        code < 128
    }
}

/// `addr` as an IPv4-mapped IPv6 address.
pub fn v4_mapped(addr: u32) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[10] = 0xff;
    a[11] = 0xff;
    a[12..].copy_from_slice(&addr.to_be_bytes());
    a
}

/// The IPv4 address of an IPv4-mapped field; all 96 prefix bits are checked
/// (section 5).
pub fn v4_of(a: &[u8; 16]) -> Option<u32> {
    (a[..10].iter().all(|&b| b == 0) && a[10] == 0xff && a[11] == 0xff).then(|| u32::from_be_bytes([a[12], a[13], a[14], a[15]]))
}

/// True for `::` and for `::ffff:0.0.0.0`, both of which mean "no address".
pub fn is_unspecified(a: &[u8; 16]) -> bool {
    a.iter().all(|&b| b == 0) || v4_of(a) == Some(0)
}

fn addr16(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

mod field {
    pub const VERSION: usize = 0;
    pub const OPCODE: usize = 1;
    pub const RESULT: usize = 3;
    pub const LIFETIME: usize = 4;
    pub const CLIENT_ADDR: usize = 8;
    pub const EPOCH: usize = 8;
}

/// A view over a PCP request: the common header and what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Request<T> {
    /// Validates that the 24-octet header is present.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        need("pcp", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Request { buffer })
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    pub fn is_response(&self) -> bool {
        self.buffer.as_ref()[field::OPCODE] & RESPONSE_BIT != 0
    }

    pub fn opcode(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE] & !RESPONSE_BIT
    }

    pub fn lifetime(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::LIFETIME)
    }

    pub fn client_addr(&self) -> [u8; 16] {
        addr16(self.buffer.as_ref(), field::CLIENT_ADDR)
    }

    /// Opcode data and options.
    pub fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// Writes a request header: version 2, R clear.
pub fn emit_request_header(buf: &mut [u8], op: u8, lifetime: u32, client: [u8; 16]) {
    buf[field::VERSION] = VERSION;
    buf[field::OPCODE] = op & !RESPONSE_BIT;
    buf[2] = 0;
    buf[3] = 0;
    set_u32(buf, field::LIFETIME, lifetime);
    buf[field::CLIENT_ADDR..field::CLIENT_ADDR + 16].copy_from_slice(&client);
}

/// A view over a PCP response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Response<T> {
    /// Validates a response as a client must (section 8.3): at least 24 and
    /// at most 1100 octets, a multiple of 4, R bit set.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("pcp", HEADER_LEN, b.len())?;
        if b.len() > MAX_LEN || !b.len().is_multiple_of(4) {
            return Err(WireError::Malformed { layer: "pcp", field: Field::Length, value: b.len() as u32 });
        }
        if b[field::OPCODE] & RESPONSE_BIT == 0 {
            return Err(WireError::Malformed { layer: "pcp", field: Field::Version, value: u32::from(b[field::OPCODE]) });
        }
        Ok(Response { buffer })
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    pub fn opcode(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE] & !RESPONSE_BIT
    }

    pub fn result(&self) -> u8 {
        self.buffer.as_ref()[field::RESULT]
    }

    pub fn lifetime(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::LIFETIME)
    }

    pub fn epoch(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::EPOCH)
    }

    pub fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// Writes a response header: R set, reserved fields zero.
pub fn emit_response_header(buf: &mut [u8], version: u8, op: u8, result: u8, lifetime: u32, epoch: u32) {
    buf[field::VERSION] = version;
    buf[field::OPCODE] = op | RESPONSE_BIT;
    buf[2] = 0;
    buf[field::RESULT] = result;
    set_u32(buf, field::LIFETIME, lifetime);
    set_u32(buf, field::EPOCH, epoch);
    buf[12..HEADER_LEN].fill(0);
}

/// MAP opcode data (section 11.1) and the shared first 36 octets of PEER
/// opcode data (section 12.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Map<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Map<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        need("pcp map", MAP_LEN, buffer.as_ref().len())?;
        Ok(Map { buffer })
    }

    pub fn nonce(&self) -> [u8; NONCE_LEN] {
        let mut n = [0u8; NONCE_LEN];
        n.copy_from_slice(&self.buffer.as_ref()[..NONCE_LEN]);
        n
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[12]
    }

    pub fn internal_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 16)
    }

    /// Suggested (request) or assigned (response) external port.
    pub fn external_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 18)
    }

    pub fn external_addr(&self) -> [u8; 16] {
        addr16(self.buffer.as_ref(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Map<T> {
    pub fn set_external(&mut self, addr: [u8; 16], port: u16) {
        let b = self.buffer.as_mut();
        set_u16(b, 18, port);
        b[20..36].copy_from_slice(&addr);
    }
}

/// Writes MAP opcode data (and the first 36 octets of PEER's).
pub fn emit_map(buf: &mut [u8], nonce: [u8; NONCE_LEN], protocol: u8, internal_port: u16, external: ([u8; 16], u16)) {
    buf[..NONCE_LEN].copy_from_slice(&nonce);
    buf[12] = protocol;
    buf[13..16].fill(0);
    set_u16(buf, 16, internal_port);
    set_u16(buf, 18, external.1);
    buf[20..36].copy_from_slice(&external.0);
}

/// PEER opcode data (section 12.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Peer<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        need("pcp peer", PEER_LEN, buffer.as_ref().len())?;
        Ok(Peer { buffer })
    }

    /// The fields PEER shares with MAP.
    pub fn map(&self) -> Map<&[u8]> {
        Map { buffer: &self.buffer.as_ref()[..MAP_LEN] }
    }

    pub fn remote_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 36)
    }

    pub fn remote_addr(&self) -> [u8; 16] {
        addr16(self.buffer.as_ref(), 40)
    }
}

/// Writes PEER opcode data.
pub fn emit_peer(buf: &mut [u8], nonce: [u8; NONCE_LEN], protocol: u8, internal_port: u16, external: ([u8; 16], u16), remote: ([u8; 16], u16)) {
    emit_map(buf, nonce, protocol, internal_port, external);
    set_u16(buf, 36, remote.1);
    buf[38..40].fill(0);
    buf[40..56].copy_from_slice(&remote.0);
}

/// One option: its code and its data (without padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opt<'a> {
    pub code: u8,
    pub data: &'a [u8],
}

/// Walks the options that follow the opcode data. Each option's data is
/// padded to a multiple of 4 octets; an option whose length runs past the
/// message yields an error and ends the walk.
pub struct Options<'a> {
    rest: &'a [u8],
}

pub fn options(buf: &[u8]) -> Options<'_> {
    Options { rest: buf }
}

impl<'a> Iterator for Options<'a> {
    type Item = Result<Opt<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        if self.rest.len() < option::HEADER_LEN {
            let actual = self.rest.len();
            self.rest = &[];
            return Some(Err(WireError::Truncated { layer: "pcp option", needed: option::HEADER_LEN, actual }));
        }
        let code = self.rest[0];
        let len = usize::from(get_u16(self.rest, 2));
        let padded = len.div_ceil(4) * 4;
        let end = option::HEADER_LEN + len;
        if self.rest.len() < end {
            let actual = self.rest.len();
            self.rest = &[];
            return Some(Err(WireError::Truncated { layer: "pcp option", needed: end, actual }));
        }
        let data = &self.rest[option::HEADER_LEN..end];
        self.rest = &self.rest[(option::HEADER_LEN + padded).min(self.rest.len())..];
        Some(Ok(Opt { code, data }))
    }
}

/// Writes one option (header, data, zero padding); returns its length.
pub fn emit_option(buf: &mut [u8], code: u8, data: &[u8]) -> usize {
    buf[0] = code;
    buf[1] = 0;
    set_u16(buf, 2, data.len() as u16);
    buf[option::HEADER_LEN..option::HEADER_LEN + data.len()].copy_from_slice(data);
    let padded = data.len().div_ceil(4) * 4;
    buf[option::HEADER_LEN + data.len()..option::HEADER_LEN + padded].fill(0);
    option::HEADER_LEN + padded
}

/// The body of a FILTER option (section 13.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    /// Significant bits of `remote_addr` (96 + the IPv4 prefix length for
    /// IPv4-mapped addresses); 0: any address.
    pub prefix_len: u8,
    /// 0: any port.
    pub remote_port: u16,
    pub remote_addr: [u8; 16],
}

impl Filter {
    pub fn parse(data: &[u8]) -> Result<Filter, WireError> {
        if data.len() != option::FILTER_LEN {
            return Err(WireError::Malformed { layer: "pcp filter", field: Field::Length, value: data.len() as u32 });
        }
        Ok(Filter { prefix_len: data[1], remote_port: get_u16(data, 2), remote_addr: addr16(data, 4) })
    }

    pub fn emit(&self) -> [u8; option::FILTER_LEN] {
        let mut d = [0u8; option::FILTER_LEN];
        d[1] = self.prefix_len;
        set_u16(&mut d, 2, self.remote_port);
        d[4..].copy_from_slice(&self.remote_addr);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_request(lifetime: u32, client: u32, opts: &[(u8, &[u8])]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + MAP_LEN];
        emit_request_header(&mut b, opcode::MAP, lifetime, v4_mapped(client));
        emit_map(&mut b[HEADER_LEN..], [7; NONCE_LEN], 17, 5000, (v4_mapped(0), 0));
        for (code, data) in opts {
            let at = b.len();
            b.resize(at + 4 + data.len().div_ceil(4) * 4, 0xee);
            emit_option(&mut b[at..], *code, data);
        }
        b
    }

    #[test]
    fn request_fields_at_their_rfc_offsets() {
        let b = map_request(3600, 0x6440_0002, &[]);
        assert_eq!(&b[..8], &[2, 1, 0, 0, 0, 0, 0x0e, 0x10]);
        assert_eq!(&b[8..24], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 100, 64, 0, 2]);
        let r = Request::new_checked(&b[..]).unwrap();
        assert_eq!((r.version(), r.opcode(), r.is_response(), r.lifetime()), (2, opcode::MAP, false, 3600));
        assert_eq!(v4_of(&r.client_addr()), Some(0x6440_0002));
        let m = Map::new_checked(r.body()).unwrap();
        assert_eq!((m.nonce(), m.protocol(), m.internal_port(), m.external_port()), ([7; 12], 17, 5000, 0));
        assert!(is_unspecified(&m.external_addr()));
    }

    #[test]
    fn options_walk_with_padding_and_report_overruns() {
        let f = Filter { prefix_len: 120, remote_port: 53, remote_addr: v4_mapped(0xc633_640d) };
        let b = map_request(60, 1, &[(option::PREFER_FAILURE, &[]), (200, &[1, 2, 3]), (option::FILTER, &f.emit())]);
        let opts: Vec<_> = options(&b[HEADER_LEN + MAP_LEN..]).collect::<Result<_, _>>().unwrap();
        assert_eq!(opts.len(), 3);
        assert_eq!((opts[0].code, opts[0].data.len()), (option::PREFER_FAILURE, 0));
        assert_eq!(opts[1].data, &[1, 2, 3]);
        assert_eq!(Filter::parse(opts[2].data).unwrap(), f);
        let mut cut = b.clone();
        cut.truncate(cut.len() - 4);
        let last = options(&cut[HEADER_LEN + MAP_LEN..]).last().unwrap();
        assert!(last.is_err());
    }

    #[test]
    fn v4_mapping_checks_all_96_bits() {
        let mut a = v4_mapped(0x0102_0304);
        assert_eq!(v4_of(&a), Some(0x0102_0304));
        a[3] = 1;
        assert_eq!(v4_of(&a), None);
        assert!(is_unspecified(&[0; 16]));
        assert!(is_unspecified(&v4_mapped(0)));
        assert!(!is_unspecified(&v4_mapped(1)));
    }

    #[test]
    fn response_checks_size_and_r_bit() {
        let mut b = vec![0u8; HEADER_LEN + MAP_LEN];
        emit_response_header(&mut b, 2, opcode::MAP, result::NOT_AUTHORIZED, 1800, 77);
        let r = Response::new_checked(&b[..]).unwrap();
        assert_eq!((r.opcode(), r.result(), r.lifetime(), r.epoch()), (opcode::MAP, 2, 1800, 77));
        assert_eq!(result::name(r.result()), "NOT_AUTHORIZED");
        assert!(Response::new_checked(&b[..59]).is_err());
        assert!(Response::new_checked(&b[..20]).is_err());
        b[1] = opcode::MAP;
        assert!(Response::new_checked(&b[..]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn views_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok(r) = Request::new_checked(&bytes[..]) {
                let _ = (r.version(), r.opcode(), r.lifetime(), r.client_addr());
                if let Ok(m) = Map::new_checked(r.body()) {
                    let _ = (m.nonce(), m.protocol(), m.internal_port(), m.external_port(), m.external_addr());
                }
                if let Ok(p) = Peer::new_checked(r.body()) {
                    let _ = (p.map().nonce(), p.remote_port(), p.remote_addr());
                }
                for o in options(r.body()).flatten() {
                    let _ = Filter::parse(o.data);
                }
            }
            if let Ok(r) = Response::new_checked(&bytes[..]) {
                let _ = (r.result(), r.epoch(), r.body());
            }
        }
    }
}
