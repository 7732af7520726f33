//! natrix's NAPT44 engine: Ethernet/IPv4 frames in, translated frames (or a
//! drop reason, or generated ICMP) out, as RFC 4787, 5382, 5508, 6888 and
//! 7857 require. No I/O, no configuration parsing, no clock: the caller passes
//! time in and seeds the randomness, so every behaviour is reproducible.
//!
//! Layout: `shard` (how work splits across workers), `admin` (what
//! operators do to a running engine), `table` (hash index), `session` (mappings and sessions),
//! `subscriber`, `pool` (address and port allocation), `trackers` (one module
//! per protocol), `translate` (header rewrites), `icmp_error`, `fragment`,
//! `generate` (frames natrix sends itself), `events` (for logging), `engine`,
//! which ties them together and holds the full path, `fast` (the fast path:
//! one parse per frame; established TCP and UDP translated from the frame's
//! bytes, new outbound flows handed to the full path's handling) and `batch`
//! (`process_batch`: prefetch across a batch of frames).

pub mod admin;
pub mod config;
pub mod drop;
pub mod dslite;
pub mod error;
pub mod host_id;
pub mod nat44;
pub mod nptv6;
pub mod pcp;
pub mod pipeline;
pub mod rewrite;
pub mod state;
pub mod syn_accel;
pub mod trackers;

pub use nat44::batch;
pub use state::{deterministic, events, pool, rng, shard};

pub use config::EngineConfig;
pub use drop::DropReason;
pub use error::EngineError;
pub use pipeline::frame_buf::{FrameBuf, InBuffer};
pub use pipeline::{Engine, Stats, Verdict};
pub use state::events::{Event, EventKind};

/// The side of the NAT a frame arrives on or leaves by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Side {
    Inside = 0,
    Outside = 1,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Inside => "inside",
            Side::Outside => "outside",
        }
    }

    /// The side across the NAT: where a frame arriving here leaves.
    #[inline]
    pub fn other(self) -> Side {
        match self {
            Side::Inside => Side::Outside,
            Side::Outside => Side::Inside,
        }
    }
}

/// The transport protocols natrix translates. TCP, UDP and ICMP have
/// mappings and allocate external ports; SCTP has associations keyed by
/// verification tags and never changes a port (seed 001), so it has no port
/// space in the pool, only quota and logging like the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Proto {
    Tcp = 0,
    Udp = 1,
    Icmp = 2,
    Sctp = 3,
}

impl Proto {
    pub const COUNT: usize = 4;
    pub const ALL: [Proto; 4] = [Proto::Tcp, Proto::Udp, Proto::Icmp, Proto::Sctp];
    /// The protocols with external ports to allocate (the pool's port spaces).
    pub const WITH_PORTS: usize = 3;

    pub fn from_ip(p: u8) -> Option<Proto> {
        match p {
            natrix_wire::proto::TCP => Some(Proto::Tcp),
            natrix_wire::proto::UDP => Some(Proto::Udp),
            natrix_wire::proto::ICMP => Some(Proto::Icmp),
            natrix_wire::proto::SCTP => Some(Proto::Sctp),
            _ => None,
        }
    }

    pub fn ip_number(self) -> u8 {
        match self {
            Proto::Tcp => natrix_wire::proto::TCP,
            Proto::Udp => natrix_wire::proto::UDP,
            Proto::Icmp => natrix_wire::proto::ICMP,
            Proto::Sctp => natrix_wire::proto::SCTP,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Icmp => "icmp",
            Proto::Sctp => "sctp",
        }
    }
}
