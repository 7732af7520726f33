//! The reset a caller gets at the deadline, as if from the server: the
//! form RFC 9293 section 3.10.7.1 gives a refusal of a SYN (RST+ACK,
//! sequence number 0, acknowledgment the SYN's sequence number + 1: for a
//! Fast Open SYN with data, an ACK of the SYN alone, which its caller
//! accepts as well), which
//! a stack in SYN-SENT accepts because its ACK acknowledges the SYN
//! (section 3.10.7.3), with window 0 and no options (CONTRACTS.md).

use natrix_wire::{checksum, ethernet, ipv4, proto, tcp};

use super::attempts::Attempt;

const TCP_LEN: usize = tcp::MIN_HEADER_LEN;
/// What natrix's own datagrams start with (as its ICMP errors do).
const TTL: u8 = 64;

/// Writes the refusal of attempt `a` into `out`: the Ethernet addresses of
/// the caller's SYN swapped, from the server's address and port to the
/// caller's own, IP identification `ident`.
pub(super) fn refusal(out: &mut Vec<u8>, a: &Attempt, ident: u16) {
    let l3 = a.l3();
    out.extend_from_slice(&a.copy()[..l3]);
    ethernet::swap_addresses(out);
    let ip_at = out.len();
    out.resize(ip_at + ipv4::MIN_HEADER_LEN + TCP_LEN, 0);
    let k = &a.key;
    ipv4::emit_header(&mut out[ip_at..], k.server, k.caller, proto::TCP, (ipv4::MIN_HEADER_LEN + TCP_LEN) as u16, TTL, ident);
    let h = tcp::Header { src_port: k.server_port, dst_port: k.caller_port, seq: 0, ack: a.isn.wrapping_add(1), flags: tcp::flags::RST | tcp::flags::ACK, window: 0 };
    let segment = &mut out[ip_at + ipv4::MIN_HEADER_LEN..];
    tcp::emit_header(segment, &h, 0);
    let sum = checksum::add(checksum::pseudo_header_sum(k.server, k.caller, proto::TCP, TCP_LEN as u16), checksum::sum(segment));
    tcp::emit_header(segment, &h, !checksum::fold(sum));
}
