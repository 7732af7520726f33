//! What can stop an engine from being built.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// A table reserved up front could not be allocated.
    Memory { table: &'static str, bytes: u64 },
    /// The configuration cannot be put in force; `key` names the config key.
    Config { key: String, problem: String },
    /// A reload changed a key that sizes or partitions state.
    NeedsRestart { key: &'static str },
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Memory { table, bytes } => write!(
                f,
                "cannot reserve {} for the {table}: this host cannot give that much memory; lower nat.max_sessions (or nat.max_subscribers, or workers)",
                human_bytes(*bytes)
            ),
            EngineError::Config { key, problem } => write!(f, "{key}: {problem}"),
            EngineError::NeedsRestart { key } => write!(f, "{key} changed: that needs a restart"),
        }
    }
}

impl std::error::Error for EngineError {}

/// Bytes as operators read them: "8.0 GiB (8589934592 bytes)".
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = "bytes";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    if unit == "bytes" {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {unit} ({bytes} bytes)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units_with_the_exact_count() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(8 << 30), "8.0 GiB (8589934592 bytes)");
        assert_eq!(human_bytes(1536 << 10), "1.5 MiB (1572864 bytes)");
    }
}
