//! UDP has no state: every session idles out after the UDP timeout
//! (RFC 4787 REQ-5: at least 2 minutes, 5 by default).

use super::{TimeoutClass, TimeoutSpec};

pub const TIMEOUT: TimeoutSpec = TimeoutSpec { class: TimeoutClass::Udp, key: "udp", default_s: 300, min_s: 120, source: "RFC 4787 REQ-5" };

pub fn open() -> (u8, TimeoutClass) {
    (0, TIMEOUT.class)
}
