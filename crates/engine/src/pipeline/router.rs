//! What natrix does as a router, whatever translates the frame: the TTL and
//! hop limit, the egress MTU, and the ICMP errors it sends itself (time
//! exceeded, fragmentation needed, refusals), rate limited together (RFC
//! 1812 section 4.3.2.8). Every frame natrix sends on its own, or releases
//! after holding it, leaves through the router's output queue.

use natrix_wire::{icmp, ipv4, ipv6, proto};

use crate::config::{Addr6, EngineConfig};
use crate::drop::DropReason;
use crate::pipeline::emit::{self, OutFrame, OutQueue};
use crate::rewrite;
use crate::Side;

/// Where ICMPv6 errors come from on a side with no `address6` (RFC 4443
/// allows a link-local source; natrix has no other there).
const FALLBACK_SOURCE6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// The router's view of the configuration: its addresses and links.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Links {
    inside_addr: u32,
    /// Source of ICMP natrix sends outside.
    outside_source: u32,
    addr6: [Option<Addr6>; 2],
    egress_mtu: [u16; 2],
    errors_per_second: u32,
    /// ICMP code answering a subscriber refused for lack of resources; None: silent.
    refusal_code: Option<u8>,
}

impl Links {
    fn of(cfg: &EngineConfig) -> Links {
        Links {
            inside_addr: cfg.inside_addr,
            outside_source: cfg.outside_addr.or_else(|| cfg.pool.first().copied()).unwrap_or(0),
            addr6: [cfg.inside_addr6, cfg.outside_addr6],
            egress_mtu: cfg.egress_mtu,
            errors_per_second: cfg.icmp_errors_per_second,
            refusal_code: cfg.exhaustion_icmp_code,
        }
    }
}

pub(crate) struct Router {
    links: Links,
    out: OutQueue,
    now_ns: u64,
    now_s: u32,
    /// The second the error budget counts for, and what it has spent.
    window_s: u32,
    sent_in_window: u32,
    ip_ident: u16,
    /// Frames natrix built (errors, PCP answers) and frames it released
    /// after holding them, by the side they left on.
    pub generated: [u64; 2],
    pub released: [u64; 2],
}

impl Router {
    pub fn new(cfg: &EngineConfig) -> Router {
        Router { links: Links::of(cfg), out: OutQueue::default(), now_ns: 0, now_s: 0, window_s: 0, sent_in_window: 0, ip_ident: 0, generated: [0; 2], released: [0; 2] }
    }

    pub fn reconfigure(&mut self, cfg: &EngineConfig) {
        self.links = Links::of(cfg);
    }

    pub fn set_time(&mut self, now_ns: u64, now_s: u32) {
        self.now_ns = now_ns;
        self.now_s = now_s;
    }

    /// natrix's own IPv4 address on a side: where the ICMP it sends there comes from.
    pub fn source(&self, side: Side) -> u32 {
        match side {
            Side::Inside => self.links.inside_addr,
            Side::Outside => self.links.outside_source,
        }
    }

    pub fn drain(&mut self, f: impl FnMut(&OutFrame)) {
        self.out.drain(f);
    }

    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// An IPv4 datagram that arrived on `arrived` with TTL 1 or less dies
    /// here: time exceeded goes back from natrix's address on that side.
    pub fn check_ttl(&mut self, frame: &[u8], l3: usize, ttl: u8, arrived: Side) -> Result<(), DropReason> {
        if ttl > 1 {
            return Ok(());
        }
        self.send_icmp_error(frame, l3, self.source(arrived), arrived, (icmp::kind::TIME_EXCEEDED, 0), 0);
        Err(DropReason::TtlExpired)
    }

    /// A datagram of `total` bytes larger than the link it leaves on: with
    /// DF, tell the sender the MTU (RFC 1191 path MTU discovery); without,
    /// it goes on, to be fragmented once translated (`fragment`).
    pub fn check_mtu(&mut self, frame: &[u8], l3: usize, total: usize, dont_fragment: bool, arrived: Side) -> Result<(), DropReason> {
        let mtu = self.links.egress_mtu[arrived.other() as usize];
        if mtu == 0 || total <= usize::from(mtu) || !dont_fragment {
            return Ok(());
        }
        let src = self.source(arrived);
        self.send_icmp_error(frame, l3, src, arrived, (icmp::kind::DEST_UNREACHABLE, icmp::unreachable::FRAG_NEEDED), mtu);
        Err(DropReason::FragmentationNeeded)
    }

    /// The largest IPv4 datagram the link on `side` takes; 0: no limit known.
    pub fn egress_mtu(&self, side: Side) -> u16 {
        self.links.egress_mtu[side as usize]
    }

    pub fn decrement_ttl(&self, frame: &mut [u8], l3: usize) {
        rewrite::decrement_ttl(frame, l3);
    }

    /// RFC 6888 REQ-11: tell the subscriber why its packet went nowhere.
    pub fn refuse(&mut self, frame: &[u8], l3: usize) {
        if let Some(code) = self.links.refusal_code {
            self.send_icmp_error(frame, l3, self.links.inside_addr, Side::Inside, (icmp::kind::DEST_UNREACHABLE, code), 0);
        }
    }

    /// ICMP port unreachable for an unsolicited SYN whose hold ended at
    /// `deadline_ns`, from the external address it was sent to; stamped
    /// with the deadline, when the hold ended.
    pub fn answer_held_syn(&mut self, frame: &[u8], l3: usize, ext_addr: u32, deadline_ns: u64) {
        let now = self.now_ns;
        self.now_ns = deadline_ns;
        self.send_icmp_error(frame, l3, ext_addr, Side::Outside, (icmp::kind::DEST_UNREACHABLE, icmp::unreachable::PORT), 0);
        self.now_ns = now;
    }

    pub fn send_icmp_error(&mut self, frame: &[u8], l3: usize, src: u32, side: Side, (msg_type, code): (u8, u8), next_hop_mtu: u16) {
        if !may_trigger_icmp_error(frame, l3) || !self.spend_error_budget() {
            return;
        }
        let ident = self.next_ident();
        let mut buf = self.out.buffer();
        emit::icmp_error(&mut buf, frame, l3, src, emit::IcmpError { msg_type, code, next_hop_mtu }, ident);
        self.queue_generated(side, buf);
    }

    /// An IPv6 packet that arrived on `arrived` with hop limit 1 or less
    /// dies here: ICMPv6 time exceeded (RFC 4443 section 3.3) goes back from
    /// natrix's `address6` on that side, or fe80::1.
    pub fn check_hop_limit(&mut self, frame: &[u8], l3: usize, total: usize, hop_limit: u8, arrived: Side) -> Result<(), DropReason> {
        if hop_limit > 1 {
            return Ok(());
        }
        self.send_icmpv6_time_exceeded(frame, l3, total, arrived);
        Err(DropReason::TtlExpired)
    }

    /// `total`: bytes of the offending packet (no Ethernet padding).
    fn send_icmpv6_time_exceeded(&mut self, frame: &[u8], l3: usize, total: usize, side: Side) {
        let offending = &frame[l3..l3 + total];
        if frame.first().is_none_or(|b| b & 1 != 0) || !natrix_wire::icmpv6::may_send_error(offending, natrix_wire::icmpv6::kind::TIME_EXCEEDED, 0) {
            return;
        }
        if !self.spend_error_budget() {
            return;
        }
        let src = self.links.addr6[side as usize].map_or(FALLBACK_SOURCE6, |a| a.addr);
        let Ok(error) = natrix_wire::icmpv6::ErrorMessage::time_exceeded(src, offending) else { return };
        let mut buf = self.out.buffer();
        buf.extend_from_slice(&frame[..l3]);
        natrix_wire::ethernet::swap_addresses(&mut buf);
        let at = buf.len();
        buf.resize(at + error.packet_len(), 0);
        if error.emit(&mut buf[at..]).is_ok() {
            self.queue_generated(side, buf);
        }
    }

    pub fn decrement_hop_limit(&self, frame: &mut [u8], l3: usize) {
        if let Ok(mut p) = ipv6::Packet::new_checked(&mut frame[l3..]) {
            let h = p.hop_limit();
            p.set_hop_limit(h.saturating_sub(1));
        }
    }

    /// Queues a frame natrix built, with the next IP identification.
    pub fn emit(&mut self, side: Side, build: impl FnOnce(&mut Vec<u8>, u16)) {
        let ident = self.next_ident();
        let mut buf = self.out.buffer();
        build(&mut buf, ident);
        self.queue_generated(side, buf);
    }

    /// `emit`, stamped `at_ns` rather than now: a frame a timer sends
    /// carries the time it fell due (in replay, the capture's clock).
    pub fn emit_at(&mut self, side: Side, at_ns: u64, build: impl FnOnce(&mut Vec<u8>, u16)) {
        let ident = self.next_ident();
        let mut buf = self.out.buffer();
        build(&mut buf, ident);
        self.out.push(side, at_ns, buf);
        self.generated[side as usize] += 1;
    }

    /// Queues a byte copy of a frame natrix sent before (its IP
    /// identification included), stamped `at_ns`.
    pub fn copy_at(&mut self, side: Side, at_ns: u64, frame: &[u8]) {
        let mut buf = self.out.buffer();
        buf.extend_from_slice(frame);
        self.out.push(side, at_ns, buf);
        self.generated[side as usize] += 1;
    }

    /// `emit` for a frame that answers one natrix received (an SCTP ABORT-M
    /// or ERROR-M): within the budget its ICMP errors share, and never to a
    /// link-layer broadcast or multicast sender. False when not sent.
    pub fn emit_answer(&mut self, side: Side, received: &[u8], build: impl FnOnce(&mut Vec<u8>, u16)) -> bool {
        if received.first().is_none_or(|b| b & 1 != 0) || !self.spend_error_budget() {
            return false;
        }
        self.emit(side, build);
        true
    }

    /// A cleared buffer from the output queue's spares, for a frame the
    /// pipeline builds in place of one it received (`queue_rebuilt`) or
    /// gives back (`recycle`).
    pub fn buffer(&mut self) -> Vec<u8> {
        self.out.buffer()
    }

    /// Queues a frame the pipeline built in place of one it received (a
    /// softwire packet decapsulated or encapsulated, a SYN a middlebox
    /// function made longer), stamped `at_ns`. The pipeline counts it as
    /// forwarded.
    pub fn queue_rebuilt(&mut self, side: Side, at_ns: u64, buf: Vec<u8>) {
        self.out.push_ordered(side, at_ns, buf);
    }

    /// `queue_rebuilt` for a frame that leaves as it is: a softwire packet
    /// decapsulated and translated, or one encapsulated to its B4.
    pub fn queue_final(&mut self, side: Side, at_ns: u64, buf: Vec<u8>) {
        self.out.push_final(side, at_ns, buf);
    }

    /// Where a frame forwarded now must wait so as not to overtake one
    /// of its flow that waits in the queue: at the queue's end, once a
    /// frame forwarded, released or rebuilt (not one natrix generated)
    /// waits there. None: it may leave from where it lies.
    pub fn overtaking_at(&self) -> Option<usize> {
        self.out.ordered_len()
    }

    /// Queues a copy of a frame forwarded after others of its batch had to
    /// wait in the queue, at `at` (from `overtaking_at`): behind them, but
    /// before what its own translation queued (the fragments it released).
    pub fn queue_behind(&mut self, at: usize, side: Side, frame: &[u8]) {
        let mut buf = self.out.buffer();
        buf.extend_from_slice(frame);
        self.out.insert_final(at, side, self.now_ns, buf);
    }

    /// Whether a frame other than a final one was queued since the queue
    /// was last drained or taken from: one natrix made, released or grew,
    /// which may be for a softwire host.
    pub fn has_own_output(&self) -> bool {
        self.out.has_own()
    }

    /// A buffer the pipeline took and no longer needs.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.out.recycle(buf);
    }

    /// Takes out the queued frames `pick` chooses, to be rebuilt.
    pub fn take_queued(&mut self, pick: impl FnMut(&OutFrame) -> bool) -> Vec<OutFrame> {
        self.out.take(pick)
    }

    /// Queues a frame natrix held (a fragment that waited for its first
    /// fragment) and now forwards.
    pub fn release(&mut self, side: Side, frame: &[u8]) {
        let mut buf = self.out.buffer();
        buf.extend_from_slice(frame);
        self.out.push_ordered(side, self.now_ns, buf);
        self.released[side as usize] += 1;
    }

    pub fn next_ident(&mut self) -> u16 {
        self.ip_ident = self.ip_ident.wrapping_add(1);
        self.ip_ident
    }

    fn queue_generated(&mut self, side: Side, buf: Vec<u8>) {
        self.out.push(side, self.now_ns, buf);
        self.generated[side as usize] += 1;
    }

    fn spend_error_budget(&mut self) -> bool {
        if self.window_s != self.now_s {
            self.window_s = self.now_s;
            self.sent_in_window = 0;
        }
        if self.sent_in_window >= self.links.errors_per_second {
            return false;
        }
        self.sent_in_window += 1;
        true
    }
}

/// RFC 1812 section 4.3.2.7: no ICMP error about an ICMP error, a non-first
/// fragment, or a frame sent to a link-layer broadcast or multicast address.
fn may_trigger_icmp_error(frame: &[u8], l3: usize) -> bool {
    if frame.first().is_none_or(|b| b & 1 != 0) {
        return false;
    }
    let Ok(ip) = ipv4::Packet::new_lax(&frame[l3..]) else { return false };
    if ip.frag_offset() != 0 {
        return false;
    }
    let l4 = l3 + ip.header_len();
    !(ip.protocol() == proto::ICMP && frame.get(l4).is_some_and(|&t| icmp::classify(t) == icmp::Class::Error))
}
