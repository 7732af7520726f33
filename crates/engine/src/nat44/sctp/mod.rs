//! SCTP through NAPT44, as seed 001 designs it and draft-ietf-tsvwg-natsupp
//! specifies the wire details: addresses are translated, ports never, and
//! the CRC32c is left as it is (it does not cover the addresses).
//! Associations are told apart by their verification tags
//! (`state::associations`), share the subscriber machinery with the other
//! protocols (paired address, quotas, rate limit, events) and keep their own
//! tracker (`trackers::sctp`).
//!
//! - `chunks`: the bounded walk over a packet's control chunks (seed 001
//!   section 3.1.3: at most `max_chunks`, never further);
//! - `outbound` and `inbound`: the two directions;
//! - `associations`: opening and ending associations (quotas, events);
//! - `asconf`: multi-homing (RFC 5061 Add IP and Delete IP, natsupp's VTags);
//! - `icmp`: ICMP errors quoting SCTP packets;
//! - `reply`: what natrix sends itself: ABORT-M for a collision (seed 001
//!   section 5.2.1), ERROR-M for missing state (section 3.3).

mod asconf;
mod associations;
mod chunks;
mod icmp;
mod inbound;
mod outbound;
mod reply;

/// Who is told, with an ERROR-M "Missing State", about a packet that
/// matches no association.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyOotb {
    /// Internal hosts only: alias_sctp's default, and seed 001 section 3.3's
    /// advice never to answer unexpected packets from outside (an attacker
    /// would learn which associations exist).
    Inside,
    Both,
    None,
}

impl ReplyOotb {
    pub const ALL: [ReplyOotb; 3] = [ReplyOotb::Inside, ReplyOotb::Both, ReplyOotb::None];

    /// The name operators write in `[sctp] reply_ootb`.
    pub fn name(self) -> &'static str {
        match self {
            ReplyOotb::Inside => "inside",
            ReplyOotb::Both => "both",
            ReplyOotb::None => "none",
        }
    }

    fn covers(self, side: crate::Side) -> bool {
        match self {
            ReplyOotb::Inside => side == crate::Side::Inside,
            ReplyOotb::Both => true,
            ReplyOotb::None => false,
        }
    }
}

/// `[sctp]`: the limits seed 001 section 7 recommends, and natrix's own
/// table size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SctpConfig {
    /// Control chunks examined per packet (seed 001: 2, an AUTH and an ASCONF).
    pub max_chunks: u32,
    /// Parameters examined per chunk (seed 001: 25).
    pub max_params: u32,
    /// 0: global addresses are not tracked (seed 001's default); N: up to N
    /// per association, the first included.
    pub track_global_addresses: u32,
    pub reply_ootb: ReplyOotb,
    /// Associations the table holds (natrix's choice: 64 Ki by default).
    pub max_associations: u32,
}

impl Default for SctpConfig {
    fn default() -> Self {
        SctpConfig { max_chunks: 2, max_params: 25, track_global_addresses: 0, reply_ootb: ReplyOotb::Inside, max_associations: 1 << 16 }
    }
}

impl SctpConfig {
    fn tracks_addresses(&self) -> bool {
        self.track_global_addresses > 0
    }
}

impl crate::nat44::Nat44 {
    /// Applies what a forwarded packet's chunks said to its association:
    /// the state changes and the idle timer restarts, or the association
    /// ends (an ABORT or SHUTDOWN-COMPLETE is forwarded first, then nothing
    /// of the association matches any more).
    fn after_sctp_packet(&mut self, id: u32, signal: crate::trackers::sctp::Signal) {
        use crate::trackers::sctp::{on_packet, Next};
        match on_packet(self.assocs.state_mut(id), signal) {
            Next::Keep(class) => self.assocs.touch(id, self.now_s, class),
            Next::End => self.end_association(id),
        }
    }

    /// An ERROR-M "Missing State" back to the sender of a packet that
    /// matched no association, if `reply_ootb` covers the side it came from
    /// and the packet may be answered at all.
    fn answer_missing_state(
        &self,
        frame: &[u8],
        ip: &crate::pipeline::frame::Ip,
        side: crate::Side,
        scan: &chunks::Scan,
        h: outbound::Header,
        router: &mut crate::pipeline::router::Router,
    ) {
        if scan.never_answer || !self.cfg.sctp.reply_ootb.covers(side) {
            return;
        }
        let packet = &frame[ip.l3..ip.l4 + ip.l4_len];
        reply::send(router, frame, ip, side, &reply::missing_state(h.verification_tag, packet));
    }
}

impl crate::nat44::Nat44 {
    /// The SCTP association table, for operators' views and the bench.
    pub fn associations(&self) -> &crate::state::associations::Associations {
        &self.assocs
    }

    /// Sessions by protocol: NAPT's, and SCTP's associations.
    pub fn sessions_by_proto(&self) -> [u32; crate::Proto::COUNT] {
        self.with_associations(self.tables.sessions_by_proto())
    }

    /// Mappings by protocol: NAPT's, and SCTP's associations.
    pub fn mappings_by_proto(&self) -> [u32; crate::Proto::COUNT] {
        self.with_associations(self.tables.mappings_by_proto())
    }

    fn with_associations(&self, mut by_proto: [u32; crate::Proto::COUNT]) -> [u32; crate::Proto::COUNT] {
        by_proto[crate::Proto::Sctp as usize] = self.assocs.len() as u32;
        by_proto
    }
}
