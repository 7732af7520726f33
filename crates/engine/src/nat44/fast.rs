//! The fast path: the common packet (IPv4 without options or fragmentation,
//! TCP or UDP, belonging to a session that exists) translated straight from
//! the frame's bytes, with the address, port and TTL patched under one
//! checksum update per header. It works in two steps, so that a batch can
//! run the first for all its frames before the second: `candidate` checks
//! and parses a frame and hashes its lookup key, changing nothing; `decide`
//! finds the session and translates (`forward`). An outbound candidate
//! without a session enters the full path's policy past the parse, checks
//! and lookup already made (`open`), so a new flow is parsed and looked up
//! once, and rewritten with the same fixed-layout patch.
//! Anything else (ICMP, hairpins, fragments, options, PCP, exempt traffic,
//! frames too short to hold a TCP header, inbound packets without a
//! session, anything malformed) is not a
//! candidate, or falls out of `forward` untouched, and the full path decides
//! it on its own. The fast path only does less work for the cases it knows.

use core::hint::select_unpredictable;

use natrix_wire::{ethernet, get_u16_at, get_u32_at, proto};

use crate::drop::DropReason;
use crate::nat44::{Flow, Looked, Nat44};
use crate::pipeline::frame::{is_martian, Ip};
use crate::rewrite::{self, Which, L4};
use crate::state::identity::Endpoint;
use crate::state::sessions::{Found, NIL};
use crate::state::subscribers::NONE;
use crate::trackers::{self, Direction};
use crate::{Proto, Side};

/// Where a candidate's IPv4 header starts: right after an untagged Ethernet header.
pub(crate) const L3: usize = ethernet::HEADER_LEN;
const IP_HEADER: usize = natrix_wire::ipv4::MIN_HEADER_LEN;
/// Without IP options the transport header always starts here.
const AT: usize = L3 + IP_HEADER;
const TCP_HEADER: usize = natrix_wire::tcp::MIN_HEADER_LEN;
const UDP_HEADER: usize = natrix_wire::udp::HEADER_LEN;
/// The shortest frame the fast path takes: room for a TCP header. A UDP
/// frame is shorter only with under 12 bytes of payload where nothing padded
/// it to Ethernet's 60-byte minimum; the full path takes it.
const VIEW: usize = AT + TCP_HEADER;

/// A frame the fast path may take: checked, parsed, and its lookup key hashed.
#[derive(Clone, Copy)]
pub(crate) struct Candidate {
    hash: u64,
    /// The record a batch's prefetch guessed for the lookup; NIL if none.
    pub(crate) hint: u32,
    /// A batch's prefetch found the endpoint absent from the index: an
    /// outbound candidate most likely opens a flow.
    pub(crate) absent: bool,
    /// The subscriber a batch's prefetch found for a likely-new outbound
    /// flow; NONE if none.
    pub(crate) sub: u32,
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
    proto: Proto,
    tcp_flags: u8,
    l4_len: u16,
}

impl Candidate {
    /// The index bucket the lookup will read, for a batch to prefetch.
    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    /// The IP protocol and TCP flags, for the middlebox functions' interest.
    pub(crate) fn ip_proto(&self) -> u8 {
        self.proto.ip_number()
    }

    pub(crate) fn tcp_flags(&self) -> u8 {
        self.tcp_flags
    }

    /// Bytes of the IPv4 datagram, its 20-byte header included.
    pub(crate) fn datagram_len(&self) -> usize {
        IP_HEADER + usize::from(self.l4_len)
    }

    pub(crate) fn src(&self) -> u32 {
        self.src
    }

    pub(crate) fn dst(&self) -> u32 {
        self.dst
    }

    /// The full path's parse of the candidate `frame` (`frame::parse`),
    /// from the checks already made: untagged, no IP options, unfragmented,
    /// at least `VIEW` bytes.
    pub(crate) fn ip(&self, frame: &[u8]) -> Ip {
        Ip {
            l3: L3,
            l4: AT,
            l4_len: usize::from(self.l4_len),
            proto: self.proto.ip_number(),
            src: self.src,
            dst: self.dst,
            ttl: frame[L3 + 8],
            ident: get_u16_at(frame, L3 + 4),
            first_frag: false,
            later_frag: false,
            dont_fragment: frame[L3 + 6] & 0x40 != 0,
            tcp_flags: self.tcp_flags,
        }
    }
}

impl Nat44 {
    /// The checks the full path would make, in a form that only accepts:
    /// each one failing sends the frame there. Reads the frame, changes nothing.
    /// Inlined always: as a call it costs an established packet about 20
    /// instructions (callgrind), and the batch loop grew past the point where
    /// the compiler inlines it by itself.
    #[inline(always)]
    pub(crate) fn candidate(&self, frame: &[u8], side: Side) -> Option<Candidate> {
        self.candidate_of(ipv4_view(frame)?, frame.len(), side, |src| (!is_martian(src)).then_some(src))
    }

    /// `candidate` for a packet decapsulated from a softwire (DS-Lite) into
    /// a frame of its own: its source is the stand-in of its host behind
    /// the B4, which no frame can carry on the wire, so it passes where a
    /// martian source would not.
    #[inline]
    pub(crate) fn softwire_candidate(&self, frame: &[u8]) -> Option<Candidate> {
        self.candidate_of(ipv4_view(frame)?, frame.len(), Side::Inside, |src| crate::state::identity::is_softwire(src).then_some(src))
    }

    /// `candidate` for the IPv4 packet a softwire packet carries from
    /// `at`, still inside it, whose host has the stand-in `stand_in`: the
    /// candidate's internal address, so the lookup needs neither the
    /// packet decapsulated nor its source replaced. The bytes before `at`
    /// stand where an Ethernet header would; they are not read.
    #[inline(always)]
    pub(crate) fn carried_candidate(&self, frame: &[u8], at: usize, stand_in: u32) -> Option<Candidate> {
        let view = frame.get(at - L3..)?;
        self.candidate_of(view.first_chunk::<VIEW>()?, view.len(), Side::Inside, |_| Some(stand_in))
    }

    /// The checks of `candidate` past the Ethertype, on the `len` bytes of
    /// which `h` is the head. `internal` gives the internal address for the
    /// packet's source, None where it may not be one.
    #[inline(always)]
    fn candidate_of(&self, h: &[u8; VIEW], len: usize, side: Side, internal: impl Fn(u32) -> Option<u32>) -> Option<Candidate> {
        if h[L3] != 0x45 {
            return None;
        }
        let total = usize::from(get_u16_at(h, L3 + 2));
        // More-fragments and offset both clear; TTL left to decrement.
        if total < IP_HEADER || total > len - L3 || get_u16_at(h, L3 + 6) & 0x3fff != 0 || h[L3 + 8] <= 1 {
            return None;
        }
        let l4_len = total - IP_HEADER;
        let (proto, tcp_flags) = transport(h, l4_len)?;
        let (src, dst) = (get_u32_at(h, L3 + 12), get_u32_at(h, L3 + 16));
        let mtu = self.cfg.egress_mtu[side.other() as usize];
        let src = internal(src)?;
        if is_martian(dst) || (mtu != 0 && total > usize::from(mtu)) || !header_checksum_ok(h) {
            return None;
        }
        let (sport, dport) = (get_u16_at(h, AT), get_u16_at(h, AT + 2));
        let hash = match side {
            // Hairpins, the NAT's own address and exempt destinations take the full path.
            Side::Inside if dst != self.cfg.inside_addr && !self.pool.contains(dst) && !self.is_exempt_destination(dst, dport) => self.tables.hash_in(proto, src, sport),
            Side::Outside if self.pool.contains(dst) => self.tables.hash_out(proto, dst, dport),
            _ => return None,
        };
        Some(Candidate { hash, hint: NIL, absent: false, sub: NONE, src, dst, sport, dport, proto, tcp_flags, l4_len: l4_len as u16 })
    }

    /// Translates the candidate `frame` if its session exists and returns
    /// the side it leaves on; otherwise leaves it untouched and returns what
    /// the lookup found, for the full path's handling. `TTL`: whether the
    /// rewrite decrements the TTL too (`rewrite_forward`). Inlined always, as
    /// `candidate` is: as a call it costs an established packet about 17
    /// instructions of prologue and epilogue (callgrind).
    #[inline(always)]
    fn forward<const TTL: bool>(&mut self, frame: &mut [u8], side: Side, c: &Candidate) -> Result<Side, Option<Found>> {
        self.forward_to::<TTL>(frame, side, c, |_, addr| addr).map(|(out, _)| out)
    }

    /// `forward`, an inbound frame translated to the address `to_host`
    /// gives for its session's internal address; with the side it leaves
    /// on, that internal address.
    #[inline(always)]
    fn forward_to<const TTL: bool>(&mut self, frame: &mut [u8], side: Side, c: &Candidate, to_host: impl FnOnce(&Self, u32) -> u32) -> Result<(Side, u32), Option<Found>> {
        let (found, dir, refresh) = match side {
            Side::Inside => (self.tables.lookup_in_hinted(c.hint, c.hash, c.proto, c.src, c.sport, c.dst, c.dport), Direction::Out, true),
            Side::Outside => (self.tables.lookup_out_hinted(c.hint, c.hash, c.proto, c.dst, c.dport, c.src, c.sport), Direction::In, self.cfg.inbound_refresh),
        };
        let Some(session) = found.and_then(|f| f.session) else { return Err(found) };
        let ends = self.track(session, dir, c.tcp_flags, refresh);
        let (which, addr, port) = match side {
            Side::Inside => (Which::Src, ends.ext_addr, ends.ext_port),
            Side::Outside => (Which::Dst, to_host(self, ends.int_addr), ends.int_port),
        };
        rewrite::rewrite_forward::<TTL>(frame, c.proto == Proto::Tcp, which, addr, port);
        Ok((side.other(), ends.int_addr))
    }

    /// Decides a candidate `frame`: translated here if its session exists;
    /// an outbound one without a session opens it through the full path's
    /// handling, past the parse, checks and lookup `candidate` and `forward`
    /// have made; None: an inbound one without a session, for the full path.
    #[inline(always)]
    pub(crate) fn decide(&mut self, frame: &mut [u8], side: Side, c: &Candidate) -> Option<Result<Side, DropReason>> {
        match (self.forward::<true>(frame, side, c), side) {
            (Ok(out), _) => Some(Ok(out)),
            (Err(found), Side::Inside) => Some(self.open::<true>(frame, c, found)),
            (Err(_), Side::Outside) => None,
        }
    }

    /// `decide` for an inbound candidate where a session's internal address
    /// may be the stand-in of a host behind a DS-Lite B4: the frame is
    /// translated straight to the host's inner address (one checksum
    /// update, not one to the stand-in and another from it). With the side
    /// it leaves on, the session's internal address; None: no session, for
    /// the full path. With a softwire host's stand-in, the host too.
    #[inline(always)]
    pub(crate) fn decide_inbound_to_hosts(&mut self, frame: &mut [u8], c: &Candidate) -> Option<(Side, u32, Option<Endpoint>)> {
        let mut host = None;
        let (out, int_addr) = self
            .forward_to::<true>(frame, Side::Outside, c, |nat, addr| match nat.subs.identities().endpoint_of(addr) {
                Some(e) => {
                    host = Some(e);
                    e.inner
                }
                None => addr,
            })
            .ok()?;
        Some((out, int_addr, host))
    }

    /// `decide` for an outbound candidate whose frame must change before a
    /// flow is opened from it: `prepare` runs only when there is no session
    /// to translate it by (a softwire packet's host address gives way to
    /// its stand-in, which only the opening's policy needs to see). `TTL`
    /// false leaves the TTL to the router, for a frame middlebox functions
    /// see after translation.
    #[inline(always)]
    pub(crate) fn decide_outbound<const TTL: bool>(&mut self, frame: &mut [u8], c: &Candidate, prepare: impl FnOnce(&mut [u8])) -> Result<Side, DropReason> {
        match self.forward::<TTL>(frame, Side::Inside, c) {
            Ok(out) => Ok(out),
            Err(found) => {
                prepare(frame);
                self.open::<TTL>(frame, c, found)
            }
        }
    }

    /// For an outbound candidate whose endpoint is not in the index, so most
    /// likely a new flow: keeps its subscriber in `c.sub` (the opening
    /// checks it before use) and starts loading the two random lines opening
    /// it will touch: the port map word of the port it would keep, and the
    /// index bucket its external endpoint would go in. Only hints: a wrong
    /// guess (another port chosen, another address) costs a wasted load.
    #[inline(never)]
    pub(crate) fn prefetch_opening(&self, c: &mut Candidate) {
        let Some(sub) = self.subs.find(c.src) else { return };
        c.sub = sub;
        let paired = self.subs.get(sub).paired;
        // Not in deterministic ranges the port may lie outside of.
        let keeps_port = self.pool.keeps_wanted_port() && self.deterministic().is_none();
        if paired == NONE || !keeps_port {
            return;
        }
        self.pool.prefetch_port(paired, c.proto, c.sport);
        self.tables.prefetch_bucket(self.tables.hash_out(c.proto, self.pool.address(paired), c.sport));
    }

    /// Opens the flow of an outbound candidate that has no session, given
    /// what `forward`'s lookup found: the full path's policy from there on.
    /// Out of line, so the established path it branches from stays compact.
    #[inline(never)]
    fn open<const TTL: bool>(&mut self, frame: &mut [u8], c: &Candidate, found: Option<Found>) -> Result<Side, DropReason> {
        // A candidate is TCP or UDP (`transport`).
        debug_assert!(c.proto != Proto::Icmp);
        let l4 = if c.proto == Proto::Tcp { L4::Tcp { at: AT, len: usize::from(c.l4_len) } } else { L4::Udp { at: AT } };
        let flow = Flow { proto: c.proto, sport: c.sport, dport: c.dport, tcp_flags: c.tcp_flags, l4, icmp_class: None };
        // The full path's policy (quotas, allocation, logging, held SYNs)
        // from here on. A candidate is neither a hairpin nor ICMP, so the
        // session's external endpoint is the whole rewrite.
        let sid = self.outbound_session(c.src, c.dst, &flow, true, Looked { hash_in: c.hash, found, sub_hint: c.sub })?;
        let ends = self.tables.endpoints(sid);
        rewrite::rewrite_forward::<TTL>(frame, c.proto == Proto::Tcp, Which::Src, ends.ext_addr, ends.ext_port);
        Ok(Side::Outside)
    }
}

impl Nat44 {
    /// Whether the flow of `head`, the start of a frame as it arrived on
    /// `side`, is one the fast path translates with the rewrite alone and
    /// whose session no plain segment can change: a UDP session, or a TCP
    /// one with a SYN seen both ways and neither FIN nor RST. An offload
    /// may then repeat the last frame's rewrite on the flow's next ones.
    /// Reads the tables, changes nothing.
    pub(crate) fn steady_flow(&self, head: &[u8], side: Side) -> bool {
        self.steady_session(head, side).is_some()
    }

    /// For a flow an offload forwarded frames of since the last call: its
    /// session used now (inbound frames only where inbound refresh is on,
    /// RFC 4787 REQ-6), as the frames would have made it here. Whether the
    /// flow is still steady (`steady_flow`); if not, nothing changes.
    pub(crate) fn refresh_offloaded(&mut self, head: &[u8], side: Side) -> bool {
        let Some(id) = self.steady_session(head, side) else { return false };
        let refresh = side == Side::Inside || self.cfg.inbound_refresh;
        self.tables.on_packet(id, self.now_s, refresh, |_, _, class| class);
        true
    }

    /// The session of a steady flow (`steady_flow`).
    fn steady_session(&self, head: &[u8], side: Side) -> Option<u32> {
        let h = ipv4_view(head)?;
        let proto = Proto::from_ip(h[L3 + 9]).filter(|&p| p == Proto::Tcp || p == Proto::Udp)?;
        let (src, dst) = (get_u32_at(h, L3 + 12), get_u32_at(h, L3 + 16));
        let (sport, dport) = (get_u16_at(h, AT), get_u16_at(h, AT + 2));
        let session = match side {
            Side::Inside if !is_martian(src) && dst != self.cfg.inside_addr && !self.pool.contains(dst) && !self.is_exempt_destination(dst, dport) => {
                self.tables.find_session_in(proto, src, sport, dst, dport)
            }
            Side::Outside if self.pool.contains(dst) => self.tables.find_session_out(proto, dst, dport, src, sport),
            _ => None,
        };
        session.filter(|&id| proto == Proto::Udp || self.tables.session(id).state == trackers::tcp::SYN_OUT | trackers::tcp::SYN_IN)
    }
}

/// The fixed-length head of an untagged Ethernet/IPv4 `frame` long enough
/// for the fast path, which its checks read without bounds checks.
#[inline(always)]
fn ipv4_view(frame: &[u8]) -> Option<&[u8; VIEW]> {
    frame.first_chunk::<VIEW>().filter(|h| get_u16_at(*h, 12) == ethernet::ETHERTYPE_IPV4)
}

/// The transport of a candidate datagram of `l4_len` bytes: TCP (with its
/// flags) or UDP, its header within the datagram. Live traffic mixes the two
/// unpredictably, so the protocol picks the length to check by selects, and
/// every branch here is on something true of nearly every datagram.
#[inline(always)]
fn transport(h: &[u8; VIEW], l4_len: usize) -> Option<(Proto, u8)> {
    let p = h[L3 + 9];
    let is_tcp = p == proto::TCP;
    // TCP: the data offset, at least a bare header; UDP: its length field,
    // at least its header. Either must fit the datagram.
    let len = select_unpredictable(is_tcp, usize::from(h[AT + 12] >> 4) * 4, usize::from(get_u16_at(h, AT + 4)));
    let least = select_unpredictable(is_tcp, TCP_HEADER, UDP_HEADER);
    if !(is_tcp || p == proto::UDP) || len < least || len > l4_len {
        return None;
    }
    Some((select_unpredictable(is_tcp, Proto::Tcp, Proto::Udp), select_unpredictable(is_tcp, h[AT + 13], 0)))
}

/// RFC 1071: a 20-byte header whose checksum is right sums to all ones.
/// The one's complement sum is the plain sum taken modulo 0xffff (2^16 is 1
/// there), with all ones standing for 0, so the test is that the plain sum
/// of the header, which is never 0 (its first byte is 0x45), is a multiple
/// of 0xffff: one multiply-based remainder instead of three folds. Summed
/// as five 32-bit words in the CPU's byte order: a byte swap multiplies by
/// 2^8 modulo 0xffff, which keeps multiples multiples.
#[inline(always)]
fn header_checksum_ok(frame: &[u8; VIEW]) -> bool {
    let sum: u64 = (0..5).map(|i| u64::from(rewrite::ne_u32(frame, L3 + 4 * i))).sum();
    sum.is_multiple_of(0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 1071 as written: the sum of big-endian 16-bit words, end-around
    /// carry folded in.
    fn folded_sum(header: &[u8]) -> u16 {
        let mut sum: u32 = header.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    fn frame_with(header: [u8; IP_HEADER]) -> [u8; VIEW] {
        let mut f = [0u8; VIEW];
        f[L3..AT].copy_from_slice(&header);
        f
    }

    proptest! {
        #[test]
        fn header_checksum_test_agrees_with_rfc_1071(mut header in any::<[u8; IP_HEADER]>(), fix in any::<bool>()) {
            header[0] = 0x45;
            if fix {
                header[10] = 0;
                header[11] = 0;
                let checksum = !folded_sum(&header);
                header[10..12].copy_from_slice(&checksum.to_be_bytes());
            }
            prop_assert_eq!(header_checksum_ok(&frame_with(header)), folded_sum(&header) == 0xffff);
        }
    }
}
