//! DS-Lite's fast path through the pipeline. Most softwire packets have
//! `dslite::plain`'s shape and come from a host that has its stand-in
//! already; NAPT44's fast path takes them while they are still inside
//! their softwire: the candidate is read from the inner packet with the
//! stand-in as its internal address, so the lookup needs neither a
//! decapsulated copy nor the host's address replaced. In a batch that
//! happens in NAPT44's first stage (`prepare_batch_with_softwires`), the
//! stand-in looked up there once and carried to the decision with the
//! candidate. Only then is the inner packet made a frame of its own, where
//! it lies (the end of the IPv6 header becomes its Ethernet header, and the
//! frame's start moves past the rest, `FrameBuf::narrow`), and translated
//! there: an established flow's external address replaces the host's under
//! one checksum update, and only a packet that opens a flow gets the
//! stand-in written first (what the opening's policy, logs and refusals
//! name). A frame whose start cannot move leaves as a copy.
//!
//! A reply whose session names a stand-in is translated by the fast path
//! straight to its host's inner address (`Nat44::decide_inbound_to_hosts`)
//! and encapsulated from the record its candidate gives
//! (`encapsulate_translated`), without parsing it again.

use natrix_wire::{ethernet, get_u16_at, get_u32_at, ipv4, ipv6, tcp};

use super::frame::Ip;
use super::frame_buf::FrameBuf;
use super::{Engine, Origin, Verdict};
use crate::drop::DropReason;
use crate::dslite::plain::{self, INNER};
use crate::dslite::{encap, mss};
use crate::nat44::fast::{Candidate, L3};
use crate::nat44::MAX_BATCH;
use crate::rewrite::{self, Which};
use crate::state::deterministic::Member;
use crate::state::identity::Endpoint;
use crate::Side;

/// Where a plain softwire packet's inner packet gets its Ethernet header:
/// the last 14 bytes of the IPv6 header.
const ETH_AT: usize = INNER - L3;

/// How a softwire packet's host gets its stand-in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StandIn {
    /// Only one it has already: a batch's stage makes none.
    Existing,
    /// Made on first use: the packet is being decided.
    Interned,
}

impl Engine {
    /// NAPT44's batch stages (`nat44::batch`) for an inside batch that may
    /// hold softwire packets: an IPv4 frame gets NAPT44's candidate; a plain
    /// softwire packet that NAPT44's fast path may take, whose host has a
    /// stand-in, its carried candidate; each one's bucket and then its
    /// record on their way to the cache. Returns which slots hold a carried
    /// one (bit i for slot i), each counted decapsulated already: every
    /// carried candidate is (`decide_carried`). No stand-in is made.
    pub(super) fn prepare_batch_with_softwires<F: FrameBuf>(&mut self, chunk: &mut [F], candidates: &mut [Option<Candidate>; MAX_BATCH]) -> u64 {
        let mut softwires = 0u64;
        for (i, (f, slot)) in chunk.iter_mut().zip(candidates.iter_mut()).enumerate() {
            let frame = f.frame();
            *slot = if frame.get(12..L3) == Some(&ethernet::ETHERTYPE_IPV6.to_be_bytes()) {
                let c = self.carried_candidate(frame, StandIn::Existing);
                softwires |= u64::from(c.is_some()) << i;
                c
            } else {
                self.nat.candidate(frame, Side::Inside)
            };
            if let Some(c) = slot {
                self.nat.tables().prefetch_bucket(c.hash());
            }
        }
        for c in candidates.iter_mut().take(chunk.len()).flatten() {
            self.nat.prefetch_and_hint(c, true);
        }
        self.count_decapsulated(softwires.count_ones());
        softwires
    }

    /// Counts `n` softwire packets decapsulated, in DS-Lite's total (each
    /// B4's are counted with their candidates, `carried_candidate`).
    fn count_decapsulated(&mut self, n: u32) {
        if let Some(ds) = self.dslite.as_mut() {
            ds.stats.decapsulated += u64::from(n);
        }
    }

    /// A plain softwire packet (`dslite::plain`) of a flow NAPT44's fast
    /// path takes, decided without the generic parse. None: nothing was
    /// done (nothing counted), for the full path: another shape, a B4 that
    /// is refused, a SYN to clamp, a packet the fast path leaves alone, a
    /// host that cannot have a stand-in.
    pub(super) fn plain_softwire_in(&mut self, mut frame: &mut [u8]) -> Option<Verdict> {
        let c = self.carried_candidate(frame, StandIn::Interned)?;
        self.count_decapsulated(1);
        Some(self.decide_carried(&mut frame, &c))
    }

    /// The candidate of the IPv4 packet the softwire packet `frame`
    /// carries, its internal address the stand-in of (B4, host), if it is
    /// plain and the fast path may take it. One returned is counted
    /// decapsulated for its B4 here, where the B4 is the endpoint last
    /// found (DS-Lite's total by the caller, `count_decapsulated`): every
    /// carried candidate is decapsulated (`decide_carried`).
    #[inline]
    fn carried_candidate(&mut self, frame: &[u8], stand_in: StandIn) -> Option<Candidate> {
        let ds = self.dslite.as_ref()?;
        let (b4, len) = plain::plain_softwire(frame, &ds.cfg.aftr)?;
        let clamps = ds.cfg.mss_clamp.is_some();
        // Without the 20 bytes a TCP header needs the fast path takes nothing: no stand-in made for it.
        if len < ipv4::MIN_HEADER_LEN + tcp::MIN_HEADER_LEN {
            return None;
        }
        let host = get_u32_at(frame, INNER + ipv4::SRC_OFFSET);
        // A martian host address the full path refuses, before it takes a stand-in.
        if super::frame::is_martian(host) {
            return None;
        }
        // The endpoint last found was admitted then, under the configuration
        // still in force (a reload forgets it): a run of one softwire's
        // packets is admitted once.
        let stand_in = match self.nat.subs.identities().recent_softwire(b4, host) {
            Some(s) => s,
            None => self.admitted_stand_in(frame, b4, host, stand_in)?,
        };
        let c = self.nat.carried_candidate(frame, INNER, stand_in)?;
        let syn = c.tcp_flags() & tcp::flags::SYN != 0;
        // The AFTR's own address (PCP), SYNs to clamp, and what a middlebox function wants: the full path's.
        if c.dst() == crate::dslite::AFTR_IPV4 || (syn && clamps) || (!self.hooks.is_empty() && self.hooks.wants(c.ip_proto(), c.tcp_flags())) {
            return None;
        }
        let ids = self.nat.subs.identities_mut();
        debug_assert_eq!(ids.recent_softwire(b4, host), Some(stand_in), "the B4 counted is the candidate's");
        if let Some(k) = ids.recent_counters_mut() {
            k.decapsulated += 1;
        }
        Some(c)
    }

    /// The stand-in of host `host` behind `b4`, whose softwire packet is
    /// `frame`, if the B4 is admitted (a valid source, within `b4_prefixes`
    /// and, in deterministic mode, numbered); made if `stand_in` allows.
    #[inline(never)]
    fn admitted_stand_in(&mut self, frame: &[u8], b4: std::net::Ipv6Addr, host: u32, stand_in: StandIn) -> Option<u32> {
        let ds = self.dslite.as_ref()?;
        // Deterministic mode numbers B4s: one it does not number has no range.
        if !plain::may_be_b4(&b4) || !ds.cfg.accepts(b4) || self.nat.deterministic().is_some_and(|d| d.index_of_member(Member::B4(b4)).is_none()) {
            return None;
        }
        match (self.nat.subs.identities_mut().find_softwire(b4, host), stand_in) {
            (Some(s), _) => Some(s),
            (None, StandIn::Existing) => None,
            (None, StandIn::Interned) => {
                // A packet the full path drops unparsed (a bad checksum, lengths that disagree) makes no stand-in.
                self.nat.carried_candidate(frame, INNER, 0)?;
                self.nat.subs.identities_mut().intern_softwire(b4, host, self.now_s).ok()
            }
        }
    }

    /// Decides the softwire packet in `f` by its carried candidate `c`:
    /// decapsulated where it lies and translated there; it leaves from
    /// there, or as a copy through the output queue when `f`'s start
    /// cannot move, something queued would be overtaken, or it goes back
    /// into a softwire (a hairpin).
    pub(super) fn decide_carried<F: FrameBuf>(&mut self, f: &mut F, c: &Candidate) -> Verdict {
        let len = L3 + c.datagram_len();
        if !F::NARROWS || !self.may_change_in_place() {
            let mut copy = self.router.buffer();
            copy.extend_from_slice(&f.frame()[ETH_AT..ETH_AT + len]);
            let v = self.decapsulated(&mut copy, f.frame(), c);
            return self.send_decapsulated(v, copy);
        }
        let (outer, buf) = f.frame().split_at_mut(ETH_AT);
        match self.decapsulated(&mut buf[..len], outer, c) {
            Verdict::Forward(Side::Outside) => {
                f.narrow(ETH_AT, len);
                Verdict::Forward(Side::Outside)
            }
            // A hairpin, back into a softwire: encapsulated from a copy.
            v @ Verdict::Forward(Side::Inside) => {
                let mut copy = self.router.buffer();
                copy.extend_from_slice(&f.frame()[ETH_AT..ETH_AT + len]);
                self.send_decapsulated(v, copy)
            }
            v => v,
        }
    }

    /// A decided decapsulated packet that does not leave where it lies:
    /// sent as the frame `copy` (a hairpin goes back into a softwire), or
    /// not at all.
    fn send_decapsulated(&mut self, v: Verdict, copy: Vec<u8>) -> Verdict {
        match v {
            Verdict::Forward(out) => {
                self.send_rebuilt(out, copy, L3);
                Verdict::Consumed
            }
            v => {
                self.router.recycle(copy);
                v
            }
        }
    }

    /// Translates the softwire packet decapsulated into `buf` (its inner
    /// packet behind 14 bytes to become its Ethernet header, the softwire
    /// frame's own `outer` bytes giving its addresses), and settled.
    #[inline(always)]
    fn decapsulated(&mut self, buf: &mut [u8], outer: &[u8], c: &Candidate) -> Verdict {
        buf[..12].copy_from_slice(&outer[..12]);
        buf[12..L3].copy_from_slice(&ethernet::ETHERTYPE_IPV4.to_be_bytes());
        let stand_in = c.src();
        let result = self.nat.decide_outbound::<true>(buf, c, |buf| {
            // Opening a flow: the stand-in is the source its policy sees (logs, held SYNs, refusals quoting it).
            let at = L3 + ipv4::MIN_HEADER_LEN;
            let l4 = if c.ip_proto() == natrix_wire::proto::TCP { rewrite::L4::Tcp { at, len: c.datagram_len() - ipv4::MIN_HEADER_LEN } } else { rewrite::L4::Udp { at } };
            rewrite::rewrite(buf, L3, l4, Which::Src, stand_in, get_u16_at(buf, at));
        });
        match result {
            Ok(out) => self.forwarded(out),
            Err(r) => self.settle(buf, L3, Side::Inside, Err(r)),
        }
    }

    /// A frame NAPT44's fast path translated from candidate `c`, arrived
    /// on `side`, to the inner address of the softwire host `host`, whose
    /// stand-in `stand_in` is: encapsulated to its B4, read from the fixed
    /// layout the candidate was checked for rather than parsed again. Where
    /// it fits the softwire's MTU and its buffer has room before it, the
    /// outer headers go there and it leaves where it lies; else its frames
    /// leave through the output queue.
    #[inline(never)]
    pub(super) fn encapsulate_translated<F: FrameBuf>(&mut self, f: &mut F, side: Side, c: &Candidate, stand_in: u32, host: Endpoint) -> Verdict {
        let Some(b4) = self.nat.subs.identities().endpoint_b4(host) else { return self.softwire_verdict(Err(DropReason::NoMapping)) };
        if let Some(v) = self.encapsulate_in_buffer(f, c, stand_in, host, &b4) {
            return v;
        }
        let ip = translated_ip(f.frame(), c, stand_in);
        let result = self.encapsulate_to(f.frame(), &ip, b4, self.now_ns, Origin::of_arrival(side));
        self.softwire_verdict(result)
    }

    /// Encapsulates the translated packet in `f` (given its host's inner
    /// address, the stand-in `stand_in` its session names) to the host's
    /// B4 `b4` where it lies: its Ethernet header and the outer IPv6 header
    /// go into the room before it. None, and nothing sent, for a packet
    /// that needs fragmenting or a buffer without that room.
    fn encapsulate_in_buffer<F: FrameBuf>(&mut self, f: &mut F, c: &Candidate, stand_in: u32, host: Endpoint, b4: &std::net::Ipv6Addr) -> Option<Verdict> {
        if !F::WIDENS || !F::NARROWS || !self.may_change_in_place() {
            return None;
        }
        let ds = self.dslite.as_mut()?;
        let total = c.datagram_len();
        if !encap::fits(ds.mtus.of(b4, ds.cfg.mtu, self.now_s), total) {
            return None;
        }
        // Only a SYN has an MSS to clamp. Clamping twice (here, then in the
        // queue's path without room) changes nothing more.
        if let Some(clamp) = ds.cfg.mss_clamp.filter(|_| c.tcp_flags() & tcp::flags::SYN != 0) {
            let frame = f.frame();
            mss::clamp(frame, &translated_ip(frame, c, stand_in), clamp);
        }
        // The headers' bytes and the inner TOS, bounds checked once: the
        // frame held the inner packet behind an Ethernet header.
        let frame = f.widen_front(ipv6::HEADER_LEN)?.first_chunk_mut::<{ L3 + ipv6::HEADER_LEN + 2 }>()?;
        let ecn = frame[L3 + ipv6::HEADER_LEN + 1] & ds.ecn_mask();
        let head = frame.first_chunk_mut::<{ L3 + ipv6::HEADER_LEN }>()?;
        head.copy_within(ipv6::HEADER_LEN..ipv6::HEADER_LEN + 12, 0);
        head[12..L3].copy_from_slice(&ethernet::ETHERTYPE_IPV6.to_be_bytes());
        head[L3..].copy_from_slice(&encap::outer_header(&ds.cfg.aftr, b4, ipv6::next_header::IPV4, total, ecn));
        // Ethernet padding after the inner packet is not the softwire's:
        // cut where it lies (the frame is longer), no bounds to check.
        f.narrow(0, L3 + ipv6::HEADER_LEN + total);
        ds.stats.encapsulated += 1;
        if let Some(k) = self.nat.subs.identities_mut().endpoint_counters_mut(host) {
            k.encapsulated += 1;
        }
        Some(self.verdict_of(Ok(Some(Side::Inside))))
    }
}

/// The full path's parse of a frame NAPT44's fast path translated from
/// candidate `c` towards the stand-in `stand_in` (`frame::parse`): the
/// candidate's, its destination translated.
fn translated_ip(frame: &[u8], c: &Candidate, stand_in: u32) -> Ip {
    Ip { dst: stand_in, ..c.ip(frame) }
}
