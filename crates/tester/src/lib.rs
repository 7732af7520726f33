//! natrix's traffic generator and stateful-NAT tester.
//!
//! It measures any NAT between two of its ports the same way: natrix, the
//! Linux kernel's nftables NAT, anything else in a lab. The parts:
//!
//! - `frame`: the test frames (a tag with trial, direction, sequence
//!   number, connection and send time), SYNs, ARP replies; built and
//!   checked with the tester's own code.
//! - `flows`: the connections (RFC 9693's restricted 4-tuple space, RFC
//!   4814's pseudorandom ports) and the orders they are used in.
//! - `pacing`: when each frame is due, without cumulative error.
//! - `engine`: one thread that sends, receives, answers ARP and accounts
//!   for every frame of a trial through two `natrix_io::PacketPort`s.
//! - `search`, `stats`: RFC 2544 and RFC 9693's searches, RFC 8219's and
//!   seed 002's statistics, as pure functions.
//! - `procedure`: the tests themselves over a `Testbed` (the device under
//!   test with the tester around it).
//! - `report`, `svg`: JSON lines per the contract, the human table, plots.
//! - `ports`: AF_XDP or AF_PACKET ports; `seed002`: seed 002's load
//!   ladder; `sys`: clock, sleep, CPU and network namespace calls.

pub mod engine;
pub mod flows;
pub mod frame;
pub mod pacing;
pub mod ports;
pub mod procedure;
pub mod report;
pub mod search;
pub mod seed002;
pub mod stats;
pub mod svg;
pub mod sys;
