//! Middlebox functions plug into the pipeline here, before or after
//! translation, as netfilter's hooks and VPP's feature arcs take theirs.
//! Each function declares which frames interest it; the pipeline asks a
//! function only about those, and NAPT44's fast path stays open to every
//! frame none of them wants: with no function installed a batch pays one
//! test, with some a frame pays a mask test.

use crate::drop::DropReason;
use crate::pipeline::frame::Ip;
use crate::Side;

/// Where in the pipeline a function runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Addresses and ports as the frame arrived (inside: the subscriber's own).
    BeforeTranslation,
    /// Addresses and ports as the frame leaves.
    AfterTranslation,
}

/// Which frames a function wants to see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interest {
    /// IP protocol numbers, as a set of 256 bits (TCP 6, UDP 17, ICMP 1, SCTP 132).
    pub protocols: [u64; 4],
    /// For TCP: only segments carrying one of these flags (SYN 0x02, FIN
    /// 0x01, RST 0x04, ...); 0: every segment.
    pub tcp_flags: u8,
}

impl Interest {
    /// Every TCP segment with one of `flags` set (0: every segment).
    pub const fn tcp(flags: u8) -> Interest {
        Interest::protocol(natrix_wire::proto::TCP).with_tcp_flags(flags)
    }

    /// Every frame of one IP protocol.
    pub const fn protocol(proto: u8) -> Interest {
        let mut protocols = [0; 4];
        protocols[(proto / 64) as usize] = 1 << (proto % 64);
        Interest { protocols, tcp_flags: 0 }
    }

    const fn with_tcp_flags(self, tcp_flags: u8) -> Interest {
        Interest { tcp_flags, ..self }
    }

    fn has(&self, proto: u8) -> bool {
        self.protocols[usize::from(proto / 64)] & (1 << (proto % 64)) != 0
    }

    pub fn wants(&self, proto: u8, tcp_flags: u8) -> bool {
        self.has(proto) && (proto != natrix_wire::proto::TCP || self.tcp_flags == 0 || tcp_flags & self.tcp_flags != 0)
    }

    fn union(self, other: Interest) -> Interest {
        // A protocol wanted whole by one function is wanted whole.
        let whole_tcp = |i: &Interest| i.has(natrix_wire::proto::TCP) && i.tcp_flags == 0;
        let tcp_flags = if whole_tcp(&self) || whole_tcp(&other) { 0 } else { self.tcp_flags | other.tcp_flags };
        let mut protocols = self.protocols;
        protocols.iter_mut().zip(other.protocols).for_each(|(a, b)| *a |= b);
        Interest { protocols, tcp_flags }
    }
}

/// What a function sees of a frame: the pipeline's parse of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    /// Offsets of the IPv4 header and the transport header, and the transport's length.
    pub l3: usize,
    pub l4: usize,
    pub l4_len: usize,
    pub proto: u8,
    pub src: u32,
    pub dst: u32,
    pub tcp_flags: u8,
    /// The side the frame arrived on (before translation) or leaves by (after).
    pub side: Side,
}

/// What a function decided about a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookVerdict {
    Continue,
    Drop(DropReason),
}

/// A middlebox function.
pub trait Middlebox: Send {
    fn point(&self) -> Point;
    fn interest(&self) -> Interest;
    /// Looks at (and may change, without changing its length) a frame it
    /// declared an interest in.
    fn on_frame(&mut self, frame: &mut [u8], info: &FrameInfo) -> HookVerdict;
}

#[derive(Default)]
pub(crate) struct Hooks {
    functions: Vec<Box<dyn Middlebox>>,
    /// Every function's interest together.
    interest: Interest,
}

impl Hooks {
    pub fn add(&mut self, m: Box<dyn Middlebox>) {
        self.interest = self.interest.union(m.interest());
        self.functions.push(m);
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// Whether any function wants a frame of `proto` with `tcp_flags`.
    #[inline]
    pub fn wants(&self, proto: u8, tcp_flags: u8) -> bool {
        !self.functions.is_empty() && self.interest.wants(proto, tcp_flags)
    }

    /// Runs the functions of `at` that want the frame, in the order they
    /// were added; the first drop ends it.
    pub fn run(&mut self, at: Point, frame: &mut [u8], ip: &Ip, side: Side) -> HookVerdict {
        if !self.interest.wants(ip.proto, ip.tcp_flags) {
            return HookVerdict::Continue;
        }
        // Read from the frame, not the parse: after translation they are the rewritten ones.
        let (src, dst) = natrix_wire::ipv4::Packet::new_lax(&frame[ip.l3..]).map_or((ip.src, ip.dst), |p| (p.src_addr(), p.dst_addr()));
        let info = FrameInfo { l3: ip.l3, l4: ip.l4, l4_len: ip.l4_len, proto: ip.proto, src, dst, tcp_flags: ip.tcp_flags, side };
        for f in self.functions.iter_mut().filter(|f| f.point() == at && f.interest().wants(ip.proto, ip.tcp_flags)) {
            if let HookVerdict::Drop(r) = f.on_frame(frame, &info) {
                return HookVerdict::Drop(r);
            }
        }
        HookVerdict::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interests_say_which_frames_and_add_up() {
        let syns = Interest::tcp(0x02);
        assert!(syns.wants(6, 0x02) && syns.wants(6, 0x12));
        assert!(!syns.wants(6, 0x10), "a plain ACK is not wanted");
        assert!(!syns.wants(17, 0));
        let udp = Interest::protocol(17);
        let both = syns.union(udp);
        assert!(both.wants(17, 0) && both.wants(6, 0x02) && !both.wants(6, 0x10));
        let all_tcp = both.union(Interest::tcp(0));
        assert!(all_tcp.wants(6, 0x10), "one function wanting every segment opens them all");
        assert!(!Interest::default().wants(6, 0x02));
        assert!(!both.wants(132, 0));
        assert!(Interest::protocol(132).wants(132, 0), "SCTP has a place in the set");
    }
}
