//! Steering SCTP by tag. An association lives on the worker of its
//! subscriber, like everything a subscriber holds, so outbound SCTP is
//! steered by source address as other protocols are. Inbound SCTP names no
//! subscriber and no port natrix chose: only the tags, which the endpoints
//! chose. So the I/O thread keeps an owner table keyed by (external address,
//! internal port, remote port, tag), learned from the frames it carries:
//!
//! - an INIT a worker sends out names the internal host's tag, which every
//!   packet from the remote carries: that worker owns it;
//! - an ASCONF with the VTags parameter a worker sends out (an association
//!   opened again, draft-ietf-tsvwg-natsupp) names both tags;
//! - an INIT-ACK coming in, steered by the first tag, names the remote's
//!   own tag (what ABORT and SHUTDOWN-COMPLETE with the T bit carry): the
//!   same worker owns it.
//!
//! The table is set-associative and bounded (two keys per association of
//! `[sctp] max_associations`, per worker); a key it lost or never learned
//! sends the frame to worker 0, which drops it as out of the blue if the
//! association is another's. Entries are overwritten, never removed: a
//! stale one only steers packets that match no association anyway. A key
//! a packet was steered by since its set was last full is spared when a
//! new key needs its place (second chance, as a CLOCK cache), so the keys
//! of long-lived associations stay while ended ones' go.

use natrix_engine::nat44::sctp::SctpConfig;
use natrix_wire::sctp::{chunk, Asconf, Init, Packet};

const WAYS: usize = 4;

#[derive(Clone, Copy, Default)]
struct Entry {
    /// 0: free (a key is never 0).
    key: u64,
    worker: u16,
    /// A packet was steered by it since a new key last looked for room.
    used: bool,
}

pub(super) struct SctpOwners {
    sets: Box<[[Entry; WAYS]]>,
    /// Where a full set's search for a way to replace starts, round robin.
    victim: usize,
    max_chunks: usize,
    max_params: usize,
}

/// What steering reads of an SCTP packet.
struct Header {
    src_port: u16,
    dst_port: u16,
    tag: u32,
}

impl SctpOwners {
    /// A table for `cfg.max_associations` associations on each of `workers`.
    pub(super) fn new(cfg: &SctpConfig, workers: u16) -> SctpOwners {
        let keys = 2 * u64::from(cfg.max_associations) * u64::from(workers.max(1));
        let sets = (keys.div_ceil(WAYS as u64)).next_power_of_two().clamp(1, 1 << 22) as usize;
        SctpOwners { sets: vec![[Entry::default(); WAYS]; sets].into_boxed_slice(), victim: 0, max_chunks: cfg.max_chunks as usize, max_params: cfg.max_params as usize }
    }

    fn key(ext: u32, int_port: u16, rem_port: u16, tag: u32) -> u64 {
        let a = (u64::from(ext) << 32 | u64::from(tag)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let b = (u64::from(int_port) << 16 | u64::from(rem_port)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        (a ^ b.rotate_left(29)) | 1
    }

    fn set(&self, key: u64) -> usize {
        (key >> 40) as usize & (self.sets.len() - 1)
    }

    fn owner(&self, key: u64) -> Option<u16> {
        self.sets[self.set(key)].iter().find(|e| e.key == key).map(|e| e.worker)
    }

    /// `owner`, marking the key used: a packet was steered by it.
    fn owner_used(&mut self, key: u64) -> Option<u16> {
        let s = self.set(key);
        let e = self.sets[s].iter_mut().find(|e| e.key == key)?;
        e.used = true;
        Some(e.worker)
    }

    fn learn(&mut self, key: u64, worker: u16) {
        let s = self.set(key);
        let way = match self.sets[s].iter().position(|e| e.key == key || e.key == 0) {
            Some(w) => w,
            None => self.way_to_replace(s),
        };
        self.sets[s][way] = Entry { key, worker, used: false };
    }

    /// The way of full set `s` a new key takes: the first unused one from
    /// the round-robin start, clearing the used marks it passes (each
    /// used key is spared once).
    fn way_to_replace(&mut self, s: usize) -> usize {
        self.victim = (self.victim + 1) % WAYS;
        for i in 0..2 * WAYS {
            let way = (self.victim + i) % WAYS;
            let e = &mut self.sets[s][way];
            if !e.used {
                return way;
            }
            e.used = false;
        }
        self.victim
    }

    /// The worker of an SCTP packet to external address `dst`; an INIT-ACK
    /// to an INIT a worker sent teaches the remote's tag to the same
    /// worker. One that answers no INIT natrix knows teaches nothing: a
    /// flood of made-up ones would otherwise push live associations' keys
    /// out of the table.
    pub(super) fn steer_inbound(&mut self, dst: u32, l4: &[u8]) -> u16 {
        let Some(h) = header(l4) else { return 0 };
        let Some(w) = self.owner_used(Self::key(dst, h.dst_port, h.src_port, h.tag)) else { return 0 };
        if let Some(rem_tag) = self.first_init_tag(l4, chunk::INIT_ACK) {
            self.learn(Self::key(dst, h.dst_port, h.src_port, rem_tag), w);
        }
        w
    }

    /// The worker of an SCTP packet natrix sent from external address
    /// `src` (quoted in an ICMP error): its tag is the remote's, whose
    /// packets the same worker takes.
    pub(super) fn owner_of_sent(&self, src: u32, l4: &[u8]) -> Option<u16> {
        let h = header_lax(l4)?;
        self.owner(Self::key(src, h.src_port, h.dst_port, h.tag))
    }

    /// Learns from an SCTP packet worker `w` sends out from external
    /// address `src`: its INIT's tag, or its ASCONF's VTags.
    pub(super) fn learn_sent(&mut self, w: u16, src: u32, l4: &[u8]) {
        let Some(h) = header(l4) else { return };
        if let Some(int_tag) = self.first_init_tag(l4, chunk::INIT) {
            self.learn(Self::key(src, h.src_port, h.dst_port, int_tag), w);
        } else if let Some((int_tag, rem_tag)) = self.vtags(l4) {
            self.learn(Self::key(src, h.src_port, h.dst_port, int_tag), w);
            self.learn(Self::key(src, h.src_port, h.dst_port, rem_tag), w);
        }
    }

    /// The Initiate Tag of a packet whose first chunk is of type `t` (INIT
    /// or INIT-ACK); a chunk cut short (a first fragment) needs only its tag.
    fn first_init_tag(&self, l4: &[u8], t: u8) -> Option<u32> {
        let c = l4.get(12..)?;
        if c.first() != Some(&t) {
            return None;
        }
        let tag = Init::new_checked(c).map_or_else(|_| c.get(4..8).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])), |i| Some(i.initiate_tag()))?;
        (tag != 0).then_some(tag)
    }

    /// The VTags of an ASCONF among the chunks and parameters the engine
    /// examines too.
    fn vtags(&self, l4: &[u8]) -> Option<(u32, u32)> {
        let p = Packet::new_checked(l4).ok()?;
        let c = p.chunks(self.max_chunks).map_while(Result::ok).find(|c| c.chunk_type == chunk::ASCONF)?;
        let a = Asconf::new_checked(c.bytes).ok()?;
        a.params(self.max_params).map_while(Result::ok).find_map(|p| p.vtags())
    }
}

fn header(l4: &[u8]) -> Option<Header> {
    let p = Packet::new_checked(l4).ok()?;
    Some(Header { src_port: p.src_port(), dst_port: p.dst_port(), tag: p.verification_tag() })
}

/// The ports and tag of a packet an ICMP error quotes: its first 8 bytes,
/// all RFC 792 promises, hold them.
fn header_lax(l4: &[u8]) -> Option<Header> {
    let b = l4.first_chunk::<8>()?;
    Some(Header { src_port: u16::from_be_bytes([b[0], b[1]]), dst_port: u16::from_be_bytes([b[2], b[3]]), tag: u32::from_be_bytes([b[4], b[5], b[6], b[7]]) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXT: u32 = 0xcb00_7101;

    fn packet(tag: u32, sport: u16, dport: u16, chunk_type: u8, init_tag: u32) -> Vec<u8> {
        let mut p = vec![0u8; 12 + 20];
        p[0..2].copy_from_slice(&sport.to_be_bytes());
        p[2..4].copy_from_slice(&dport.to_be_bytes());
        p[4..8].copy_from_slice(&tag.to_be_bytes());
        p[12] = chunk_type;
        p[14..16].copy_from_slice(&20u16.to_be_bytes());
        p[16..20].copy_from_slice(&init_tag.to_be_bytes());
        p
    }

    #[test]
    fn both_tags_of_an_association_reach_the_worker_that_sent_its_init() {
        let mut o = SctpOwners::new(&SctpConfig::default(), 4);
        o.learn_sent(3, EXT, &packet(0, 5000, 38412, chunk::INIT, 0x1111));
        assert_eq!(o.steer_inbound(EXT, &packet(0x1111, 38412, 5000, chunk::INIT_ACK, 0x2222)), 3);
        assert_eq!(o.steer_inbound(EXT, &packet(0x2222, 38412, 5000, chunk::ABORT, 0)), 3, "the T bit's tag, learned from the INIT-ACK");
        assert_eq!(o.steer_inbound(EXT, &packet(0x1111, 38412, 5001, chunk::DATA, 0)), 0, "another port: unknown");
        assert_eq!(o.steer_inbound(EXT, &[0; 8]), 0);
    }

    /// An ICMP error about a packet natrix sent out (the remote's tag, the
    /// first 8 bytes quoted) goes to the association's worker.
    #[test]
    fn a_quoted_packet_natrix_sent_names_its_associations_worker() {
        let mut o = SctpOwners::new(&SctpConfig::default(), 4);
        o.learn_sent(3, EXT, &packet(0, 5000, 38412, chunk::INIT, 0x1111));
        o.steer_inbound(EXT, &packet(0x1111, 38412, 5000, chunk::INIT_ACK, 0x2222));
        let sent = packet(0x2222, 5000, 38412, chunk::DATA, 0);
        assert_eq!(o.owner_of_sent(EXT, &sent[..8]), Some(3));
        assert_eq!(o.owner_of_sent(EXT, &packet(0x3333, 5000, 38412, chunk::DATA, 0)[..8]), None);
    }

    #[test]
    fn an_init_ack_to_no_init_natrix_sent_teaches_nothing() {
        let mut o = SctpOwners::new(&SctpConfig::default(), 4);
        assert_eq!(o.steer_inbound(EXT, &packet(0x1111, 38412, 5000, chunk::INIT_ACK, 0x2222)), 0);
        assert_eq!(o.owner(SctpOwners::key(EXT, 5000, 38412, 0x2222)), None);
    }

    /// A long-lived association's key, steered by between new keys, stays
    /// while new associations churn through its set; a key nothing steers
    /// by goes.
    #[test]
    fn a_key_in_use_outlives_the_churn_of_new_ones() {
        let cfg = SctpConfig { max_associations: 1, ..SctpConfig::default() };
        let mut o = SctpOwners::new(&cfg, 1);
        assert_eq!(o.sets.len(), 1, "one set: every key competes");
        o.learn_sent(7, EXT, &packet(0, 5000, 36412, chunk::INIT, 0x1111));
        o.learn_sent(6, EXT, &packet(0, 5001, 36412, chunk::INIT, 0x2222));
        for churn in 0..20u32 {
            assert_eq!(o.steer_inbound(EXT, &packet(0x1111, 36412, 5000, chunk::DATA, 0)), 7, "round {churn}");
            o.learn_sent(1, EXT, &packet(0, 6000 + churn as u16, 36412, chunk::INIT, 0x9000 + churn));
        }
        assert_eq!(o.owner(SctpOwners::key(EXT, 5001, 36412, 0x2222)), None, "the idle association's key went");
    }

    #[test]
    fn a_full_set_forgets_one_key_and_keeps_the_rest() {
        let cfg = SctpConfig { max_associations: 1, ..SctpConfig::default() };
        let mut o = SctpOwners::new(&cfg, 1);
        for tag in 1..=5u32 {
            o.learn(SctpOwners::key(EXT, 1, 2, tag), tag as u16);
        }
        let known = (1..=5u32).filter(|&t| o.owner(SctpOwners::key(EXT, 1, 2, t)) == Some(t as u16)).count();
        assert_eq!(known, WAYS);
    }
}
