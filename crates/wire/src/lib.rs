//! Zero-copy views over the packet formats natrix translates.
//!
//! Each protocol has a view `Packet<T: AsRef<[u8]>>` built with `new_checked`,
//! which validates lengths once so that no getter can panic afterwards, and a
//! private `field` module of byte ranges. Setters never change lengths, except
//! those that say so (`ipv6::Packet::set_payload_len`, `tcp_options::insert`).
//!
//! - `ethernet`, `arp`: frames and address resolution for IPv4.
//! - `ipv4`, `ipv6`: network headers; `ipv6` walks the extension headers
//!   (bounded) to the upper layer and the fragment header's facts.
//! - `tcp`, `tcp_options`, `udp`, `sctp`: transport headers; `tcp_options`
//!   iterates, overwrites with NOPs and inserts options (HOST_ID, MSS clamping);
//!   `sctp` has the common header, chunks, INIT parameters and the CRC32c.
//! - `icmp`, `icmpv6`: ICMP for IPv4 and IPv6, with Neighbor Discovery and
//!   error builders for router mode.
//! - `pcp`: Port Control Protocol messages.
//! - `checksum`: the Internet checksum, the IPv4 and IPv6 pseudo-headers, and
//!   incremental updates; `partial_checksum` finishes the transport
//!   checksums a sender's offload left for its NIC.
//!
//! Views over untrusted bytes never allocate and never panic once built.

pub mod arp;
pub mod checksum;
pub mod error;
pub mod ethernet;
pub mod icmp;
pub mod icmpv6;
pub mod ipv4;
pub mod ipv6;
pub mod partial_checksum;
pub mod pcp;
pub mod sctp;
pub mod tcp;
pub mod tcp_options;
pub mod udp;

pub use error::{Field, InsertError, WireError};

/// IP protocol numbers natrix cares about.
pub mod proto {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const IPV6: u8 = 41;
    pub const ICMPV6: u8 = 58;
    pub const SCTP: u8 = 132;
}

// One bounds check per access, and always inlined: these sit on the per-packet path.
#[inline(always)]
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

#[inline(always)]
pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[inline(always)]
pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Reads a big-endian u16 at `at` (callers have validated the length).
#[inline(always)]
pub fn get_u16_at(b: &[u8], at: usize) -> u16 {
    get_u16(b, at)
}

/// Reads a big-endian u32 at `at` (callers have validated the length).
#[inline(always)]
pub fn get_u32_at(b: &[u8], at: usize) -> u32 {
    get_u32(b, at)
}

/// Writes a big-endian u16 at `at` (callers have validated the length).
#[inline(always)]
pub fn set_u16_at(b: &mut [u8], at: usize, v: u16) {
    set_u16(b, at, v)
}
