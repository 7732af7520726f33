//! UDP has no state: every session idles out after the UDP timeout
//! (RFC 4787 REQ-5: at least 2 minutes, 5 by default).

use super::TimeoutClass;

pub fn timeout_class() -> TimeoutClass {
    TimeoutClass::Udp
}
