//! Transport checksums a sender left for its NIC to finish.
//!
//! A kernel that sends TCP or UDP through an interface with checksum
//! offload (a veth has it by default) writes only the pseudo-header's sum
//! into the checksum field and marks the packet for the hardware to finish
//! (CHECKSUM_PARTIAL); for SCTP with CRC offload it leaves the CRC32c 0.
//! Over a veth no hardware ever finishes them: the frame reaches the peer
//! that way, and the peer's kernel, which knows the mark, trusts it. A
//! program that reads the frame's bytes does not know it. AF_PACKET says
//! so (TP_STATUS_CSUMNOTREADY); AF_XDP says nothing. A NAT that updates
//! such a field incrementally, or forwards it, sends on a checksum that no
//! receiver accepts. So the field is finished here first, where it looks
//! as an offload leaves it: for a frame the kernel marked (`complete`),
//! and for one it may not have (`complete_if_partial`), where the whole
//! does not verify as it is. Looked for: TCP, UDP and SCTP in IPv4, in
//! IPv6 after any Hop-by-Hop and Destination Options headers (a sending
//! kernel's socket options, or ip6tnl's Tunnel Encapsulation Limit, RFC
//! 2473), and in IPv4 inside IPv6 (a DS-Lite B4's softwire, RFC 6333).
//! Not behind any other extension header (a Routing header moves the
//! pseudo-header's destination, a fragment is never left partial, AH and
//! ESP protect or hide what follows), nor behind a Home Address option
//! (RFC 6275), which moves its source, nor in any other tunnel.
use crate::checksum::{fold, fold64, pseudo_header_sum, pseudo_header_sum_v6, sum};
use crate::ipv6::{next_header, MAX_EXT_HEADERS};
use crate::{get_u16, get_u32, proto, sctp};

const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const IPV6_HEADER: usize = 40;
/// Destination options (RFC 8200 section 4.2; RFC 6275 section 6.3).
const PAD1: u8 = 0;
const HOME_ADDRESS: u8 = 0xc9;

/// A frame's TCP segment, UDP datagram or SCTP packet: where it lies,
/// where its checksum field is, and its pseudo-header's sum (not SCTP's).
struct Transport {
    start: usize,
    end: usize,
    field: usize,
    pseudo: u32,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tcp,
    Udp,
    Sctp,
}

/// What `complete_if_partial` found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A checksum not as an offload leaves it, or none natrix looks for.
    NotPartial,
    /// As an offload leaves it (a TCP or UDP field holding exactly the
    /// pseudo-header's sum, an SCTP CRC32c of 0), yet whole: left alone.
    /// One whole TCP or UDP frame in 65,535 looks so.
    LooksPartialButWhole,
    /// Left partial, and finished.
    Finished,
}

impl Found {
    /// Whether the checksum looked as an offload leaves it, finished or not.
    pub fn looks_partial(self) -> bool {
        self != Found::NotPartial
    }
}

/// Finishes the transport checksum of `frame` (Ethernet, untagged IPv4 or
/// IPv6, as the module says) where it looks as a sender's offload leaves
/// it and the whole does not verify; says what it found.
///
/// A whole checksum that happens to look so verifies and is left alone.
/// A corrupt one that happens to (one in 65,535 corrupt TCP or UDP frames)
/// is finished over the bytes as they are, which only a receiver's own
/// checks could have caught anyway.
pub fn complete_if_partial(frame: &mut [u8]) -> Found {
    let Some(t) = transport(frame).filter(|t| left_partial(frame, t)) else { return Found::NotPartial };
    let finished = match t.kind {
        Kind::Sctp => {
            let crc = sctp_crc(frame, &t);
            crc != 0 && {
                write_crc(frame, &t, crc);
                true
            }
        }
        Kind::Tcp | Kind::Udp => {
            let whole = sum(&frame[t.start..t.end]);
            fold(fold64(u64::from(t.pseudo) + u64::from(whole))) != 0xffff && {
                finish(frame, &t, whole);
                true
            }
        }
    };
    if finished {
        Found::Finished
    } else {
        Found::LooksPartialButWhole
    }
}

/// Finishes the transport checksum of `frame` (as for
/// `complete_if_partial`), which the kernel says is partial, where it
/// looks so. False where it does not: a partial checksum where the module
/// says none is looked for, which natrix cannot find.
pub fn complete(frame: &mut [u8]) -> bool {
    let Some(t) = transport(frame).filter(|t| left_partial(frame, t)) else { return false };
    match t.kind {
        Kind::Sctp => write_crc(frame, &t, sctp_crc(frame, &t)),
        Kind::Tcp | Kind::Udp => finish(frame, &t, sum(&frame[t.start..t.end])),
    }
    true
}

/// Whether the checksum field looks as an offload leaves it. A TCP or UDP
/// field equal to the pseudo-header's sum, one's complement (0 and 0xffff
/// alike); a UDP field of 0 means no checksum (RFC 768), which an offload
/// never leaves, as the pseudo-header's sum is never 0.
fn left_partial(frame: &[u8], t: &Transport) -> bool {
    match t.kind {
        Kind::Sctp => get_u32(frame, t.field) == 0,
        Kind::Tcp | Kind::Udp => {
            let field = get_u16(frame, t.field);
            !(t.kind == Kind::Udp && field == 0) && fold(fold64(u64::from(t.pseudo) + u64::from(!field))) == 0xffff
        }
    }
}

/// Writes the TCP or UDP checksum of a transport whose bytes, the field
/// included, sum to `whole`. A UDP checksum computed as 0 is sent as all
/// ones (RFC 768).
fn finish(frame: &mut [u8], t: &Transport, whole: u32) {
    // The field's own value taken back out of the sum it is part of.
    let rest = fold64(u64::from(whole) + u64::from(!get_u16(frame, t.field)));
    let c = !fold(fold64(u64::from(t.pseudo) + u64::from(rest)));
    let c = if t.kind == Kind::Udp && c == 0 { 0xffff } else { c };
    frame[t.field..t.field + 2].copy_from_slice(&c.to_be_bytes());
}

/// The SCTP packet's CRC32c (RFC 9260 appendix A), its field taken as 0.
fn sctp_crc(frame: &[u8], t: &Transport) -> u32 {
    sctp::Packet::new_checked(&frame[t.start..t.end]).map_or(0, |p| p.compute_checksum())
}

fn write_crc(frame: &mut [u8], t: &Transport, crc: u32) {
    if let Ok(mut p) = sctp::Packet::new_checked(&mut frame[t.start..t.end]) {
        p.set_checksum(crc);
    }
}

/// The transport of an untagged IPv4 or IPv6 frame.
fn transport(frame: &[u8]) -> Option<Transport> {
    match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        ETHERTYPE_IPV4 => transport_v4(frame, ETH_HEADER, frame.len()),
        ETHERTYPE_IPV6 => transport_v6(frame),
        _ => None,
    }
}

/// The transport of the IPv4 datagram at `frame[at..]`, within `limit`
/// (the frame's end, or the end of the IPv6 packet that carries it); not of
/// a fragment, as offloads never leave a fragment's checksum partial.
// Inlined, as `located` is: out of line, they made every frame's check
// dearer (`cargo bench -p natrix-engine --bench micro -- "partial checksum"`).
#[inline(always)]
fn transport_v4(frame: &[u8], at: usize, limit: usize) -> Option<Transport> {
    let ip = frame.get(at..at + 20)?;
    let header_len = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || header_len < 20 || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let (start, end) = (at + header_len, at + total);
    if end > limit {
        return None;
    }
    let src = u32::from_be_bytes([ip[12], ip[13], ip[14], ip[15]]);
    let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    // A transport within an IPv4 datagram is shorter than 64 KiB.
    let pseudo = |p, len: usize| pseudo_header_sum(src, dst, p, len as u16);
    located(frame, ip[9], start, end, pseudo)
}

/// An IPv6 packet's transport, after any options headers, or that of the
/// IPv4 datagram it carries.
fn transport_v6(frame: &[u8]) -> Option<Transport> {
    let ip = frame.get(ETH_HEADER..ETH_HEADER + IPV6_HEADER)?;
    if ip[0] >> 4 != 6 {
        return None;
    }
    let end = ETH_HEADER + IPV6_HEADER + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let (p, start) = past_options_headers(frame, ip[6], ETH_HEADER + IPV6_HEADER, end)?;
    if p == next_header::IPV4 {
        return transport_v4(frame, start, end);
    }
    let address = |at: usize| -> [u8; 16] { ip[at..at + 16].try_into().expect("16 bytes") };
    let (src, dst) = (address(8).into(), address(24).into());
    let pseudo = |p, len: usize| pseudo_header_sum_v6(src, dst, p, len as u32);
    located(frame, p, start, end, pseudo)
}

/// The header after the Hop-by-Hop (first only, RFC 8200 section 4.1) and
/// Destination Options headers that start at `at` with next header `nh`,
/// and where it starts. None where one of them runs past `end`, holds a
/// Home Address option, or there are more than an IPv6 walk allows.
fn past_options_headers(frame: &[u8], mut nh: u8, mut at: usize, end: usize) -> Option<(u8, usize)> {
    let first = at;
    for _ in 0..=MAX_EXT_HEADERS {
        match nh {
            next_header::HOP_BY_HOP if at == first => {}
            next_header::DEST_OPTIONS => {}
            next_header::HOP_BY_HOP => return None,
            _ => return Some((nh, at)),
        }
        let len = (usize::from(*frame.get(at + 1)?) + 1) * 8;
        let options = frame.get(at + 2..at + len).filter(|_| at + len <= end)?;
        if nh == next_header::DEST_OPTIONS && has_home_address(options) {
            return None;
        }
        (nh, at) = (frame[at], at + len);
    }
    None
}

/// Whether options (type, length, value; Pad1 a single byte) hold a Home
/// Address option, which makes the address it carries the pseudo-header's
/// source (RFC 6275 section 11.3.1).
fn has_home_address(mut options: &[u8]) -> bool {
    while let Some(&kind) = options.first() {
        if kind == HOME_ADDRESS {
            return true;
        }
        let len = if kind == PAD1 { 1 } else { options.get(1).map_or(options.len(), |&l| 2 + usize::from(l)) };
        options = options.get(len..).unwrap_or_default();
    }
    false
}

/// The transport of protocol `p` in `frame[start..end]`, where it is TCP,
/// UDP or SCTP and whole within the frame; `pseudo(p, length)` is its
/// pseudo-header's sum. A UDP datagram ends where its own length says
/// (RFC 768), which may be before the IP payload does.
#[inline(always)]
fn located(frame: &[u8], p: u8, start: usize, end: usize, pseudo: impl Fn(u8, usize) -> u32) -> Option<Transport> {
    let (kind, at, min_len) = match p {
        proto::TCP => (Kind::Tcp, 16, 20),
        proto::UDP => (Kind::Udp, 6, 8),
        proto::SCTP => (Kind::Sctp, 8, sctp::HEADER_LEN),
        _ => return None,
    };
    if end > frame.len() || end < start + min_len {
        return None;
    }
    let end = match kind {
        Kind::Udp => Some(start + usize::from(get_u16(frame, start + 4))).filter(|&e| e >= start + min_len && e <= end)?,
        Kind::Tcp | Kind::Sctp => end,
    };
    let pseudo = if kind == Kind::Sctp { 0 } else { pseudo(p, end - start) };
    Some(Transport { start, end, field: start + at, pseudo, kind })
}

#[cfg(test)]
mod tests;
