//! One module per protocol, as netfilter does. Each tracker owns its state
//! machine, its timeout classes and what configures them (the `[timeouts]`
//! key, the default, the minimum its RFC sets): the control plane reads
//! `TIMEOUTS` rather than keeping its own list. The pipeline reaches a
//! tracker through `open` and `on_packet`, which dispatch by protocol.

pub mod icmp;
pub mod sctp;
pub mod tcp;
pub mod udp;

use crate::Proto;

/// Which idle timeout applies to a session: a compact id stored in every
/// session record; what each class means belongs to its tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TimeoutClass {
    Udp = 0,
    TcpEstablished = 1,
    TcpTransitory = 2,
    Icmp = 3,
    SctpInit = 4,
    Sctp = 5,
}

impl TimeoutClass {
    pub const COUNT: usize = 6;
    pub const ALL: [TimeoutClass; 6] = [Self::Udp, Self::TcpEstablished, Self::TcpTransitory, Self::Icmp, Self::SctpInit, Self::Sctp];
    /// The classes of NAPT sessions (mappings' sessions); SCTP associations
    /// are timed in their own table.
    pub const NAPT: [TimeoutClass; 4] = [Self::Udp, Self::TcpEstablished, Self::TcpTransitory, Self::Icmp];
}

/// A timeout class as operators configure it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutSpec {
    pub class: TimeoutClass,
    /// The key in `[timeouts]`.
    pub key: &'static str,
    pub default_s: u32,
    /// Below this the RFC `source` names is not met (accepted with a warning).
    pub min_s: u32,
    pub source: &'static str,
}

/// Every timeout class, in `TimeoutClass` order.
pub const TIMEOUTS: [TimeoutSpec; TimeoutClass::COUNT] = [udp::TIMEOUT, tcp::ESTABLISHED, tcp::TRANSITORY, icmp::TIMEOUT, sctp::INIT, sctp::UP];

/// Which way a packet crosses the NAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Out,
    In,
}

/// The state and timeout class of a new session whose first packet went
/// `dir` with `tcp_flags`.
#[inline]
pub fn open(proto: Proto, dir: Direction, tcp_flags: u8) -> (u8, TimeoutClass) {
    match proto {
        Proto::Tcp => tcp::open(dir, tcp_flags),
        Proto::Udp => udp::open(),
        Proto::Icmp => icmp::open(),
        Proto::Sctp => sctp::open(),
    }
}

/// Runs a packet of a session through its tracker; returns the class the
/// session has now.
#[inline]
pub fn on_packet(proto: Proto, state: &mut u8, class: TimeoutClass, dir: Direction, tcp_flags: u8) -> TimeoutClass {
    // Most packets change nothing: UDP and ICMP ones (no flags, state 0)
    // and TCP segments without SYN, FIN or RST of connections no RST
    // closed, which leave the state and so the class it gives. Testing
    // that first spares a branch on the protocol, which live traffic mixes
    // unpredictably.
    if !tcp::acts_on(tcp_flags, *state) {
        debug_assert!(proto != Proto::Tcp || class == tcp::timeout_class(*state), "a TCP session's class follows its state");
        return class;
    }
    match proto {
        Proto::Tcp => tcp::on_segment(state, dir, tcp_flags),
        // SCTP's state changes come from its chunks, not from TCP flags.
        Proto::Udp | Proto::Icmp | Proto::Sctp => class,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_one_spec_in_its_place() {
        for (i, spec) in TIMEOUTS.iter().enumerate() {
            assert_eq!(spec.class as usize, i);
            assert!(spec.min_s <= spec.default_s, "{}: the default meets the minimum", spec.key);
        }
    }
}
