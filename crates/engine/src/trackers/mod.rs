//! One module per protocol, as netfilter does: each owns its timeout class and
//! its state machine.

pub mod icmp;
pub mod tcp;
pub mod udp;

/// Which idle timeout applies to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TimeoutClass {
    Udp = 0,
    TcpEstablished = 1,
    TcpTransitory = 2,
    Icmp = 3,
}

impl TimeoutClass {
    pub const COUNT: usize = 4;
    pub const ALL: [TimeoutClass; 4] = [Self::Udp, Self::TcpEstablished, Self::TcpTransitory, Self::Icmp];
}

/// Which way a packet crosses the NAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Out,
    In,
}
