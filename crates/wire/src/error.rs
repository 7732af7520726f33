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
    /// An IPv6 next header value where the format forbids it (Hop-by-Hop after the first header).
    NextHeader,
    /// The number of IPv6 extension headers, past the bound a walk allows.
    ExtensionHeaders,
    /// A message type a view does not accept.
    Type,
    /// A message code a view does not accept.
    Code,
    /// A checksum field holding a value the format forbids (zero for UDP over IPv6).
    Checksum,
    /// The IP protocol (or IPv6 upper-layer next header) where another was needed.
    Protocol,
    /// The fragment fields (IPv4 flags and offset, IPv6 offset and M flag) where
    /// an unfragmented packet was needed.
    Fragment,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Version => "version",
            Field::HeaderLength => "header length",
            Field::TotalLength => "total length",
            Field::DataOffset => "data offset",
            Field::Length => "length",
            Field::NextHeader => "next header",
            Field::ExtensionHeaders => "extension header count",
            Field::Type => "type",
            Field::Code => "code",
            Field::Checksum => "checksum",
            Field::Protocol => "protocol",
            Field::Fragment => "fragment flags and offset",
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

/// Why options could not be inserted into a TCP header (`tcp_options::insert`).
/// The frame is left unchanged in every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The options would take `needed` bytes, more than the 40 a TCP header holds.
    NoRoom { needed: usize },
    /// The buffer is too short to shift the payload: it needs `needed` bytes and has `actual`.
    NoTailRoom { needed: usize, actual: usize },
    /// The segment, or the options already in it, are malformed.
    Wire(WireError),
}

impl fmt::Display for InsertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InsertError::NoRoom { needed } => {
                write!(f, "tcp options: no room, needs {needed} bytes of options, at most {} fit", crate::tcp_options::MAX_LEN)
            }
            InsertError::NoTailRoom { needed, actual } => {
                write!(f, "tcp options: no tail room to grow the segment, buffer needs {needed} bytes, has {actual}")
            }
            InsertError::Wire(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for InsertError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InsertError::Wire(e) => Some(e),
            _ => None,
        }
    }
}

impl From<WireError> for InsertError {
    fn from(e: WireError) -> Self {
        InsertError::Wire(e)
    }
}
