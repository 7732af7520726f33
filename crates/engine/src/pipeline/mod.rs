//! The per-frame pipeline around the translators.

pub mod emit;
