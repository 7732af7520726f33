//! ICMP query sessions are keyed by identifier (RFC 5508 section 3.1) and idle
//! out after the ICMP timeout (REQ-1: at least 60 s). Errors never touch them.

use super::{TimeoutClass, TimeoutSpec};

pub const TIMEOUT: TimeoutSpec = TimeoutSpec { class: TimeoutClass::Icmp, key: "icmp", default_s: 60, min_s: 60, source: "RFC 5508 REQ-1" };

pub fn open() -> (u8, TimeoutClass) {
    (0, TIMEOUT.class)
}
