//! Session sync: an active node streams its NAT state changes to its
//! standby (docs/SCALE-OUT.md). `wire` is the datagram format, `window`
//! the sequence, acknowledgement and retransmission rules; both are pure,
//! so the transport around them is all that does I/O.

pub mod window;
pub mod wire;
