//! Hashes of flow keys for the indices. Seeded so that an outsider cannot aim
//! colliding flows at one bucket.

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xd6e8_feb8_6659_fd93;

#[inline]
fn mix(a: u64, b: u64) -> u64 {
    let r = u128::from(a ^ K1) * u128::from(b ^ K2);
    (r as u64) ^ ((r >> 64) as u64)
}

/// Hash of a 5-tuple (protocol, one address and port, the remote address and port).
#[inline]
pub fn five_tuple(seed: u64, proto: u8, addr: u32, port: u16, rem_addr: u32, rem_port: u16) -> u64 {
    let a = (u64::from(addr) << 32) | u64::from(rem_addr);
    let b = (u64::from(port) << 32) | (u64::from(rem_port) << 16) | u64::from(proto);
    mix(a ^ seed, b.wrapping_add(seed.rotate_left(17)))
}

/// Hash of a 3-tuple endpoint (protocol, address, port).
#[inline]
pub fn endpoint(seed: u64, proto: u8, addr: u32, port: u16) -> u64 {
    mix(u64::from(addr) ^ seed, ((u64::from(port) << 8) | u64::from(proto)).wrapping_add(seed.rotate_left(29)))
}

/// Hash of an address alone.
#[inline]
pub fn address(seed: u64, addr: u32) -> u64 {
    mix(u64::from(addr) ^ seed, seed.rotate_left(41))
}
