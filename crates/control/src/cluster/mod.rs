//! natrix beyond one machine (docs/SCALE-OUT.md): the checks that hold a
//! cluster's node files together.

pub mod check;
