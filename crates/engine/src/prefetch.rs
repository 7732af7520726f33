//! Batch prefetching. A lookup in a table much larger than the caches costs
//! a memory round trip (100+ ns) for the index bucket and another for the
//! session; done one packet at a time they serialise. A caller holding a
//! batch of frames first calls `prefetch(frame, side, Stage::Bucket)` on all
//! of them, then `Stage::Session`, then `process`: the loads of the whole
//! batch overlap. Only hints: a wrong guess costs a wasted load, never a
//! wrong answer.

use natrix_wire::{ethernet, get_u16_at, get_u32_at, ipv4, proto};

use crate::engine::Engine;
use crate::{Proto, Side};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Bucket,
    Session,
}

impl Engine {
    pub fn prefetch(&self, frame: &[u8], side: Side, stage: Stage) {
        let Some(hash) = self.session_hash(frame, side) else { return };
        let outbound = side == Side::Inside;
        match stage {
            Stage::Bucket => self.tables.prefetch_bucket(outbound, hash),
            Stage::Session => self.tables.prefetch_session(outbound, hash),
        }
    }

    /// The hash the fast path will look the frame's session up by, from a
    /// quick parse that trusts the headers (process() checks them).
    fn session_hash(&self, frame: &[u8], side: Side) -> Option<u64> {
        let eth = ethernet::Frame::new_checked(frame).ok()?;
        let l3 = eth.payload_offset();
        let ip = ipv4::Packet::new_checked(frame.get(l3..)?).ok()?;
        if ip.frag_offset() != 0 {
            return None;
        }
        let l4 = l3 + ip.header_len();
        if frame.len() < l4 + 8 {
            return None;
        }
        let (p, sport, dport) = match ip.protocol() {
            proto::TCP => (Proto::Tcp, get_u16_at(frame, l4), get_u16_at(frame, l4 + 2)),
            proto::UDP => (Proto::Udp, get_u16_at(frame, l4), get_u16_at(frame, l4 + 2)),
            proto::ICMP => (Proto::Icmp, get_u16_at(frame, l4 + 4), 0),
            _ => return None,
        };
        let (src, dst) = (get_u32_at(frame, l3 + 12), get_u32_at(frame, l3 + 16));
        Some(match (side, p) {
            (Side::Inside, Proto::Icmp) => self.tables.hash_in(p, src, sport, dst, 0),
            (Side::Inside, _) => self.tables.hash_in(p, src, sport, dst, dport),
            (Side::Outside, Proto::Icmp) => self.tables.hash_out(p, dst, sport, src, 0),
            (Side::Outside, _) => self.tables.hash_out(p, dst, dport, src, sport),
        })
    }
}
