//! The bounded walk over an SCTP packet's chunks (seed 001 section 3.1.3):
//! at most `max_chunks` are examined, and the walk stops at the first DATA
//! chunk, since control chunks come before DATA in a packet (RFC 9260
//! section 6.10) and DATA changes no state. Chunks past the bound are
//! forwarded unexamined; a packet is never dropped for having more.

use natrix_wire::sctp::{self, chunk, Init};
use natrix_wire::WireError;

use crate::drop::DropReason;
use crate::trackers::sctp::Signal;

/// What the examined chunks of one packet say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Scan {
    /// The first chunk's type: INIT and INIT-ACK are alone in their packet.
    pub first: u8,
    /// The Initiate Tag of a first INIT or INIT-ACK chunk; 0 otherwise.
    pub init_tag: u32,
    /// Where the first chunk ends (its padding excluded), from the SCTP header.
    pub first_end: usize,
    /// An ABORT or SHUTDOWN-COMPLETE with the T bit: the packet carries its
    /// sender's own tag, not its peer's (RFC 9260 section 8.5.1).
    pub reflected: bool,
    /// The strongest state change examined: End over ShutdownAck over InitAck.
    pub signal: Signal,
    /// The first ASCONF chunk examined: (start, end) from the SCTP header.
    pub asconf: Option<(usize, usize)>,
    /// An ABORT, SHUTDOWN-COMPLETE, ERROR or INIT-ACK was examined: such a
    /// packet is never answered with an ERROR-M (RFC 9260 section 8.4,
    /// draft-ietf-tsvwg-natsupp "Handling of Missing State").
    pub never_answer: bool,
}

/// One chunk as far as this packet holds it: whole, or (in a first
/// fragment) cut short after its header.
struct Seen<'a> {
    chunk_type: u8,
    flags: u8,
    offset: usize,
    bytes: &'a [u8],
    whole: bool,
}

/// Walks the chunks of the SCTP packet `l4` (common header included). In a
/// first fragment the packet is cut short: the chunk running past the end is
/// examined as far as it goes, and the walk ends there.
pub(super) fn scan(l4: &[u8], max_chunks: u32, first_fragment: bool) -> Result<Scan, DropReason> {
    let packet = sctp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
    if l4.len() == sctp::HEADER_LEN {
        return Err(DropReason::SctpMalformed);
    }
    let mut s = Scan { first: 0, init_tag: 0, first_end: 0, reflected: false, signal: Signal::None, asconf: None, never_answer: false };
    let mut chunks = packet.chunks(max_chunks as usize);
    let mut i = 0;
    while let Some(c) = chunks.next() {
        let seen = match c {
            Ok(c) => Seen { chunk_type: c.chunk_type, flags: c.flags, offset: c.offset, bytes: c.bytes, whole: true },
            Err(WireError::Truncated { .. }) if first_fragment => match cut_short(l4, chunks.rest()) {
                Some(seen) => seen,
                None => break,
            },
            Err(_) => return Err(DropReason::SctpMalformed),
        };
        if !note(&mut s, i, &seen)? || !seen.whole {
            break;
        }
        i += 1;
    }
    Ok(s)
}

/// The chunk at the start of `rest`, cut short by the end of a first
/// fragment: its header must be whole and its length no less than 4.
fn cut_short<'a>(l4: &'a [u8], rest: &'a [u8]) -> Option<Seen<'a>> {
    let length = u16::from_be_bytes([*rest.get(2)?, *rest.get(3)?]);
    (length >= 4).then(|| Seen { chunk_type: rest[0], flags: rest[1], offset: l4.len() - rest.len(), bytes: rest, whole: false })
}

/// Notes what chunk number `i` says; false when the walk ends at it (DATA).
fn note(s: &mut Scan, i: usize, c: &Seen) -> Result<bool, DropReason> {
    let end = c.offset + c.bytes.len();
    if i == 0 {
        s.first = c.chunk_type;
        s.first_end = end;
    }
    match c.chunk_type {
        chunk::DATA => return Ok(false),
        chunk::INIT | chunk::INIT_ACK if i > 0 => return Err(DropReason::SctpMalformed),
        chunk::INIT => s.init_tag = initiate_tag(c)?,
        chunk::INIT_ACK => {
            s.init_tag = initiate_tag(c)?;
            s.never_answer = true;
            s.signal = stronger(s.signal, Signal::InitAck);
        }
        chunk::ABORT | chunk::SHUTDOWN_COMPLETE => {
            s.reflected |= c.flags & sctp::flags::T != 0;
            s.never_answer = true;
            s.signal = Signal::End;
        }
        chunk::SHUTDOWN_ACK => s.signal = stronger(s.signal, Signal::ShutdownAck),
        chunk::ERROR => s.never_answer = true,
        chunk::ASCONF if s.asconf.is_none() && c.whole => s.asconf = Some((c.offset, end)),
        _ => {}
    }
    Ok(true)
}

/// An INIT or INIT-ACK's Initiate Tag, which is never 0 (RFC 9260 section
/// 3.3.2). A chunk cut by a fragment's end needs only the tag's bytes.
fn initiate_tag(c: &Seen) -> Result<u32, DropReason> {
    let tag = if c.whole {
        Init::new_checked(c.bytes).map_err(|_| DropReason::SctpMalformed)?.initiate_tag()
    } else {
        c.bytes.get(4..8).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    match tag {
        0 => Err(DropReason::SctpMalformed),
        tag => Ok(tag),
    }
}

fn stronger(a: Signal, b: Signal) -> Signal {
    let rank = |s| match s {
        Signal::None => 0,
        Signal::InitAck => 1,
        Signal::ShutdownAck => 2,
        Signal::End => 3,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet of `chunks` (type, flags, value) after a 12-byte header.
    fn packet(chunks: &[(u8, u8, &[u8])]) -> Vec<u8> {
        let mut p = vec![0x13, 0x88, 0x96, 0x0c, 0, 0, 0, 1, 0, 0, 0, 0];
        for (t, f, v) in chunks {
            p.extend_from_slice(&[*t, *f]);
            p.extend_from_slice(&((4 + v.len()) as u16).to_be_bytes());
            p.extend_from_slice(v);
            p.resize(p.len().next_multiple_of(4), 0);
        }
        p
    }

    fn init_value(tag: u32) -> Vec<u8> {
        let mut v = tag.to_be_bytes().to_vec();
        v.extend_from_slice(&[0, 1, 0, 0, 0, 10, 0, 10, 0, 0, 0, 1]);
        v
    }

    #[test]
    fn an_init_names_its_tag_and_must_be_alone_and_nonzero() {
        let s = scan(&packet(&[(chunk::INIT, 0, &init_value(0x1234))]), 2, false).unwrap();
        assert_eq!((s.first, s.init_tag, s.signal, s.never_answer), (chunk::INIT, 0x1234, Signal::None, false));
        assert_eq!(scan(&packet(&[(chunk::INIT, 0, &init_value(0))]), 2, false), Err(DropReason::SctpMalformed));
        assert_eq!(scan(&packet(&[(chunk::SACK, 0, &[0; 12]), (chunk::INIT, 0, &init_value(7))]), 2, false), Err(DropReason::SctpMalformed));
        assert_eq!(scan(&packet(&[(chunk::INIT, 0, &[0; 8])]), 2, false), Err(DropReason::SctpMalformed), "shorter than an INIT");
        let s = scan(&packet(&[(chunk::INIT_ACK, 0, &init_value(9))]), 2, false).unwrap();
        assert_eq!((s.init_tag, s.signal, s.never_answer), (9, Signal::InitAck, true));
    }

    #[test]
    fn the_strongest_signal_wins_and_t_bits_are_noted() {
        let s = scan(&packet(&[(chunk::SHUTDOWN_ACK, 0, &[]), (chunk::ABORT, 1, &[])]), 2, false).unwrap();
        assert_eq!((s.signal, s.reflected, s.never_answer), (Signal::End, true, true));
        let s = scan(&packet(&[(chunk::SHUTDOWN_COMPLETE, 0, &[])]), 2, false).unwrap();
        assert_eq!((s.signal, s.reflected), (Signal::End, false));
        let s = scan(&packet(&[(chunk::ERROR, 0x02, &[])]), 2, false).unwrap();
        assert!(s.never_answer && s.signal == Signal::None);
    }

    #[test]
    fn the_walk_stops_at_the_bound_and_at_data() {
        let flood: Vec<(u8, u8, &[u8])> = (0..300).map(|_| (chunk::HEARTBEAT, 0, &[][..])).chain([(chunk::ABORT, 0, &[][..])]).collect();
        let s = scan(&packet(&flood), 2, false).unwrap();
        assert_eq!(s.signal, Signal::None, "the ABORT lies past the bound: not examined");
        let s = scan(&packet(&[(chunk::DATA, 0, &[0; 12]), (chunk::ABORT, 0, &[])]), 25, false).unwrap();
        assert_eq!(s.signal, Signal::None, "nothing after DATA is examined");
        let s = scan(&packet(&[(chunk::AUTH, 0, &[0; 8]), (chunk::ASCONF, 0, &[0; 4])]), 2, false).unwrap();
        assert_eq!(s.asconf, Some((24, 32)));
        let s = scan(&packet(&[(chunk::AUTH, 0, &[0; 8]), (chunk::ASCONF, 0, &[0; 4])]), 1, false).unwrap();
        assert_eq!(s.asconf, None);
    }

    #[test]
    fn bad_lengths_are_malformed_only_among_those_examined() {
        let mut p = packet(&[(chunk::SACK, 0, &[0; 12]), (chunk::HEARTBEAT, 0, &[0; 4]), (chunk::HEARTBEAT, 0, &[])]);
        for bad in [0u16, 3, 200] {
            p[30..32].copy_from_slice(&bad.to_be_bytes());
            assert_eq!(scan(&p, 2, false), Err(DropReason::SctpMalformed), "length {bad}");
            assert!(scan(&p, 1, false).is_ok(), "length {bad} past the bound");
        }
        assert_eq!(scan(&p[..12], 2, false), Err(DropReason::SctpMalformed), "no chunk at all");
        assert_eq!(scan(&p[..11], 2, false), Err(DropReason::L4Truncated));
        let cut = packet(&[(chunk::SACK, 0, &[0; 12]), (chunk::DATA, 0, &[0; 100])]);
        assert!(scan(&cut[..60], 2, true).is_ok(), "a first fragment ends mid-chunk");
        assert_eq!(scan(&cut[..60], 2, false), Err(DropReason::SctpMalformed));
    }
}
