//! natrix beyond one machine (docs/SCALE-OUT.md): the checks that hold a
//! cluster's node files together, and session sync to a standby.

pub mod bgp;
pub mod check;
pub mod node;
pub mod sync;
