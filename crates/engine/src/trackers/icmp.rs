//! ICMP query sessions are keyed by identifier (RFC 5508 section 3.1) and idle
//! out after the ICMP timeout (REQ-1: at least 60 s). Errors never touch them.

use super::TimeoutClass;

pub fn timeout_class() -> TimeoutClass {
    TimeoutClass::Icmp
}
