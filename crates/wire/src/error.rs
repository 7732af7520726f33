use core::fmt;

/// Why a view refused a buffer. Lengths say what was required and what was there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The buffer is shorter than the header (or the length a header field claims).
    Truncated { layer: &'static str, needed: usize, actual: usize },
    /// A header field holds a value the format forbids.
    Malformed { layer: &'static str, field: Field, value: u32 },
}

/// The header fields whose values a view checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Version,
    HeaderLength,
    TotalLength,
    DataOffset,
    Length,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Version => "version",
            Field::HeaderLength => "header length",
            Field::TotalLength => "total length",
            Field::DataOffset => "data offset",
            Field::Length => "length",
        })
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated { layer, needed, actual } => {
                write!(f, "{layer}: truncated, needs {needed} bytes, has {actual}")
            }
            WireError::Malformed { layer, field, value } => {
                write!(f, "{layer}: invalid {field} {value}")
            }
        }
    }
}

impl std::error::Error for WireError {}

pub(crate) fn need(layer: &'static str, needed: usize, actual: usize) -> Result<(), WireError> {
    if actual < needed {
        Err(WireError::Truncated { layer, needed, actual })
    } else {
        Ok(())
    }
}
