//! MSS clamping for softwire TCP (what deployed AFTRs do, not an RFC 6333
//! rule): a host behind a B4 believes it has a 1500-byte IPv4 path, but its
//! packets travel 40 bytes fatter. A SYN in either direction whose MSS
//! option exceeds the clamp is lowered to it, checksum patched.

use natrix_wire::{get_u16_at, set_u16_at, tcp, tcp_options};

use crate::pipeline::frame::Ip;

/// Lowers the MSS option of the TCP SYN (or SYN-ACK) `ip` to `clamp`;
/// true when it changed the segment.
pub(crate) fn clamp(frame: &mut [u8], ip: &Ip, clamp: u16) -> bool {
    if ip.proto != natrix_wire::proto::TCP || ip.later_frag || ip.tcp_flags & tcp::flags::SYN == 0 {
        return false;
    }
    let seg = &mut frame[ip.l4..ip.l4 + ip.l4_len];
    let Ok(mut opts) = tcp_options::Options::new_checked(&mut *seg) else { return false };
    let at = match opts.find(tcp_options::kind::MSS) {
        Ok(Some(o)) if o.bytes.len() == 4 && u16::from_be_bytes([o.bytes[2], o.bytes[3]]) > clamp => o.offset + 2,
        _ => return false,
    };
    let Ok(delta) = opts.overwrite(at, &clamp.to_be_bytes()) else { return false };
    let c = tcp::CHECKSUM_OFFSET;
    set_u16_at(seg, c, delta.apply(get_u16_at(seg, c)));
    true
}
