//! Zero-copy views over the packet formats natrix translates.
//!
//! Each protocol has a view `Packet<T: AsRef<[u8]>>` built with `new_checked`,
//! which validates lengths once so that no getter can panic afterwards, and a
//! private `field` module of byte ranges. Setters never change lengths.

pub mod arp;
pub mod checksum;
pub mod error;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod pcp;
pub mod tcp;
pub mod udp;

pub use error::{Field, WireError};

/// IP protocol numbers natrix cares about.
pub mod proto {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
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
