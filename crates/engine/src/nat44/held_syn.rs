//! RFC 5382 REQ-4: an unsolicited inbound SYN (no TCP mapping at its
//! external address and port) is held for a while before it is answered
//! with ICMP port unreachable, and dropped silently if the subscriber's own
//! SYN for that connection goes out meanwhile (simultaneous open).

use std::collections::VecDeque;

use crate::config::UnsolicitedSyn;
use crate::pipeline::router::Router;

/// Enough of a held SYN's frame to quote its IP header and 8 bytes of TCP.
const HELD_SYN_BYTES: usize = 128;

struct HeldSyn {
    deadline_ns: u64,
    ext_addr: u32,
    ext_port: u16,
    rem_addr: u32,
    rem_port: u16,
    l3: usize,
    len: usize,
    bytes: [u8; HELD_SYN_BYTES],
}

/// The SYNs held, in deadline order (every hold is equally long).
pub(super) struct HeldSyns {
    held: VecDeque<HeldSyn>,
    max: usize,
}

impl HeldSyns {
    pub fn new(max: usize) -> HeldSyns {
        HeldSyns { held: VecDeque::with_capacity(max), max }
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Holds the SYN in `frame` (IPv4 header at `l3`) sent to `ext_addr:ext_port`
    /// from `rem_addr:rem_port` until `deadline_ns`; beyond the bound it is only dropped.
    #[allow(clippy::too_many_arguments)]
    pub fn hold(&mut self, frame: &[u8], l3: usize, ext_addr: u32, ext_port: u16, rem_addr: u32, rem_port: u16, deadline_ns: u64) {
        if self.held.len() >= self.max {
            return;
        }
        let len = frame.len().min(HELD_SYN_BYTES);
        let mut bytes = [0u8; HELD_SYN_BYTES];
        bytes[..len].copy_from_slice(&frame[..len]);
        self.held.push_back(HeldSyn { deadline_ns, ext_addr, ext_port, rem_addr, rem_port, l3, len, bytes });
    }

    /// An outbound SYN for a held connection silences the held one.
    pub fn cancel(&mut self, ext_addr: u32, ext_port: u16, rem_addr: u32, rem_port: u16) {
        self.held.retain(|h| !(h.ext_addr == ext_addr && h.ext_port == ext_port && h.rem_addr == rem_addr && h.rem_port == rem_port));
    }

    /// Answers every hold that ended by `now_ns`.
    pub fn answer_due(&mut self, now_ns: u64, policy: UnsolicitedSyn, router: &mut Router) {
        while self.held.front().is_some_and(|h| h.deadline_ns <= now_ns) {
            if let Some(h) = self.held.pop_front() {
                answer(&h, policy, router);
            }
        }
    }

    /// Answers every hold as if it had ended (the end of a capture).
    pub fn answer_all(&mut self, policy: UnsolicitedSyn, router: &mut Router) {
        while let Some(h) = self.held.pop_front() {
            answer(&h, policy, router);
        }
    }
}

fn answer(h: &HeldSyn, policy: UnsolicitedSyn, router: &mut Router) {
    if policy == UnsolicitedSyn::IcmpPortUnreachable {
        router.answer_held_syn(&h.bytes[..h.len], h.l3, h.ext_addr, h.deadline_ns);
    }
}
