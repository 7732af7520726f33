//! ICMPv6 errors through NPTv6: the quoted packet travelled the other way,
//! so the address of it that names the host behind natrix is its other
//! one. Arriving inside (an inside host's error about a packet it was sent)
//! the quote's destination is mapped inside to outside; arriving outside
//! (an error about a packet an inside host sent) the quote's source is
//! mapped outside to inside. Linux's SNPT and DNPT targets do the same.
//!
//! No checksum changes: the quoted addresses sit at even offsets of the
//! ICMPv6 message (8 + 8 and 8 + 24), so the mapping keeps the message's
//! one's-complement sum as it keeps the address's, and the ICMPv6 checksum
//! still verifies (so does the quoted transport checksum, over the quoted
//! pseudo-header).

use natrix_wire::{icmp, icmpv6, ipv6};

use super::binding::Direction;
use super::{Nptv6, DST_AT, SRC_AT};
use crate::drop::DropReason;
use crate::pipeline::frame::Ip6;

/// The ICMPv6 header before the quoted packet.
const QUOTE_AT: usize = icmpv6::HEADER_LEN;

/// Maps the quoted packet's address of an ICMPv6 error in `frame`, if the
/// packet is one and a binding covers that address; true when one did.
/// A quote too short to hold an IPv6 header is left as it is.
pub(super) fn map_quoted(nptv6: &Nptv6, frame: &mut [u8], ip: &Ip6, dir: Direction) -> Result<bool, DropReason> {
    if !is_error_with_quote(frame, ip) {
        return Ok(false);
    }
    let quoted = ip.l4 + QUOTE_AT;
    let at = match dir {
        Direction::Outbound => quoted + DST_AT,
        Direction::Inbound => quoted + SRC_AT,
    };
    nptv6.map_in_place(frame, at, dir)
}

/// An ICMPv6 error message (types 0-127) whose quote starts with an IPv6
/// header, within the packet's payload length.
fn is_error_with_quote(frame: &[u8], ip: &Ip6) -> bool {
    if ip.proto != ipv6::next_header::ICMPV6 || !ip.l4_header {
        return false;
    }
    let end = ip.l3 + ip.total;
    let quoted = ip.l4 + QUOTE_AT;
    end >= quoted + ipv6::HEADER_LEN && icmpv6::classify(frame[ip.l4]) == icmp::Class::Error && ipv6::Packet::new_lax(&frame[quoted..end]).is_ok()
}
