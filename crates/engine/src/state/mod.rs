//! The NAT's state, apart from the code that decides what to do with it:
//! the flow index, mapping and session records, SCTP associations, the address and port pool,
//! subscribers, how state splits across workers, NAT events, and the
//! deterministic (RFC 7422) formula.

pub mod associations;
pub mod deterministic;
pub mod events;
pub mod hash;
pub mod identity;
pub mod index;
pub(crate) mod memory;
pub mod pool;
pub mod rng;
pub mod sessions;
pub mod shard;
pub mod subscribers;
pub mod timers;
