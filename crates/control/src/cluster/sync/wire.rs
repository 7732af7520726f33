//! The session sync wire format: what an active node tells its standby
//! about NAT state, in UDP datagrams (natrix's own format, as conntrackd's
//! FTFW and VPP's NAT HA each have theirs). Every field is big-endian.
//!
//! ```text
//! header (24 bytes)
//!  0      2        3      4          8          12         16      18      20
//! +------+--------+------+----------+----------+----------+-------+-------+---------+
//! | 'NX' | ver 1  | kind | session  | sequence | base/ack | count | 0     | before  |
//! +------+--------+------+----------+----------+----------+-------+-------+---------+
//! kind 1 DATA: `count` records follow; `sequence` numbers this message,
//!        `base` is the oldest sequence the sender still holds (messages
//!        before it were given up), `before` counts the records the
//!        session sent before this message's, so the receiver knows
//!        exactly how many records it never got.
//! kind 2 ACK:  every DATA up to `ack` (the `base/ack` field) arrived in
//!        order; `session` is the sender's session being acknowledged.
//! kind 3 ALIVE: the active node's heartbeat when it has nothing to send:
//!        `sequence` is the next it will use, `base` and `before` as in
//!        DATA (so a receiver learns of losses at the end of a burst).
//! kind 4 RESYNC: the standby asks the active node's `session` for all the
//!        state it holds (sent when the standby first hears a session:
//!        it started, or its partner did).
//!
//! record (24 bytes)
//!  0      1       2          4          8          12         14        16         20         22
//! +------+-------+----------+----------+----------+----------+---------+----------+----------+----+
//! | kind | proto | int port | int addr | ext addr | ext port | ext end | rem addr | rem port | 0  |
//! +------+-------+----------+----------+----------+----------+---------+----------+----------+----+
//! ```
//!
//! `session` is chosen by the sender when it starts, so a restarted active
//! node is told apart from a late datagram of its earlier life.

use std::fmt;

use natrix_engine::{EventKind, Proto};

pub const MAGIC: [u8; 2] = *b"NX";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 24;
pub const RECORD_LEN: usize = 24;
/// Records in one datagram: header and records within 1400 bytes, below
/// any Ethernet path's MTU once IP and UDP headers are added.
pub const MAX_RECORDS: usize = (1400 - HEADER_LEN) / RECORD_LEN;

/// What happened to a piece of NAT state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    MappingCreated = 1,
    /// The mapping was deleted: its port goes through hold-down on the standby too.
    MappingDeleted = 2,
    SessionCreated = 3,
    SessionDeleted = 4,
    BlockAllocated = 5,
    /// The block was released: held down like a mapping's port.
    BlockReleased = 6,
}

impl RecordKind {
    pub const ALL: [RecordKind; 6] =
        [RecordKind::MappingCreated, RecordKind::MappingDeleted, RecordKind::SessionCreated, RecordKind::SessionDeleted, RecordKind::BlockAllocated, RecordKind::BlockReleased];

    /// The record an engine event becomes; events that change no state
    /// (exhaustion, quota refusals) are not synced.
    pub fn of_event(kind: EventKind) -> Option<RecordKind> {
        match kind {
            EventKind::MappingCreated => Some(RecordKind::MappingCreated),
            EventKind::MappingDeleted => Some(RecordKind::MappingDeleted),
            EventKind::SessionCreated => Some(RecordKind::SessionCreated),
            EventKind::SessionDeleted => Some(RecordKind::SessionDeleted),
            EventKind::BlockAllocated => Some(RecordKind::BlockAllocated),
            EventKind::BlockReleased => Some(RecordKind::BlockReleased),
            EventKind::AddressesExhausted | EventKind::PortsExhausted | EventKind::QuotaExceeded => None,
        }
    }

    fn from_byte(b: u8) -> Option<RecordKind> {
        RecordKind::ALL.into_iter().find(|k| *k as u8 == b)
    }
}

/// One change of NAT state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    pub kind: RecordKind,
    pub proto: Proto,
    pub int_addr: u32,
    pub int_port: u16,
    pub ext_addr: u32,
    /// The mapping's port, or the block's first.
    pub ext_port: u16,
    /// The block's last port; `ext_port` otherwise.
    pub ext_port_end: u16,
    /// Sessions: the remote endpoint; zero otherwise.
    pub rem_addr: u32,
    pub rem_port: u16,
}

impl Record {
    /// None also for a DS-Lite softwire host's events: they name the host
    /// by its inner address and B4, which the records do not carry, and
    /// softwires are not synced (docs/SCALE-OUT.md).
    pub fn of_event(e: &natrix_engine::Event) -> Option<Record> {
        if e.b4.is_some() {
            return None;
        }
        Some(Record {
            kind: RecordKind::of_event(e.kind)?,
            proto: e.proto,
            int_addr: e.int_addr,
            int_port: e.int_port,
            ext_addr: e.ext_addr,
            ext_port: e.ext_port,
            ext_port_end: e.ext_port_end,
            rem_addr: e.rem_addr,
            rem_port: e.rem_port,
        })
    }

    /// The event a standby's engine installs (`Engine::install_synced`).
    pub fn to_event(&self) -> natrix_engine::Event {
        let kind = match self.kind {
            RecordKind::MappingCreated => EventKind::MappingCreated,
            RecordKind::MappingDeleted => EventKind::MappingDeleted,
            RecordKind::SessionCreated => EventKind::SessionCreated,
            RecordKind::SessionDeleted => EventKind::SessionDeleted,
            RecordKind::BlockAllocated => EventKind::BlockAllocated,
            RecordKind::BlockReleased => EventKind::BlockReleased,
        };
        natrix_engine::Event {
            kind,
            time_ns: 0,
            proto: self.proto,
            int_addr: self.int_addr,
            int_port: self.int_port,
            ext_addr: self.ext_addr,
            ext_port: self.ext_port,
            ext_port_end: self.ext_port_end,
            rem_addr: self.rem_addr,
            rem_port: self.rem_port,
            b4: None,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.push(self.proto.ip_number());
        out.extend_from_slice(&self.int_port.to_be_bytes());
        out.extend_from_slice(&self.int_addr.to_be_bytes());
        out.extend_from_slice(&self.ext_addr.to_be_bytes());
        out.extend_from_slice(&self.ext_port.to_be_bytes());
        out.extend_from_slice(&self.ext_port_end.to_be_bytes());
        out.extend_from_slice(&self.rem_addr.to_be_bytes());
        out.extend_from_slice(&self.rem_port.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
    }

    fn decode(b: &[u8; RECORD_LEN]) -> Result<Record, DecodeError> {
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let kind = RecordKind::from_byte(b[0]).ok_or(DecodeError::RecordKind(b[0]))?;
        let proto = Proto::from_ip(b[1]).ok_or(DecodeError::Protocol(b[1]))?;
        if b[22..24] != [0, 0] {
            return Err(DecodeError::Reserved);
        }
        let (ext_port, ext_port_end) = (u16_at(12), u16_at(14));
        if ext_port_end < ext_port {
            return Err(DecodeError::ReversedBlock { first: ext_port, last: ext_port_end });
        }
        Ok(Record { kind, proto, int_port: u16_at(2), int_addr: u32_at(4), ext_addr: u32_at(8), ext_port, ext_port_end, rem_addr: u32_at(16), rem_port: u16_at(20) })
    }
}

/// A decoded datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Data { session: u32, sequence: u32, base: u32, before: u32, records: Vec<Record> },
    Ack { session: u32, ack: u32 },
    Alive { session: u32, next: u32, base: u32, before: u32 },
    Resync { session: u32 },
}

const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_ALIVE: u8 = 3;
const KIND_RESYNC: u8 = 4;

/// Why a datagram was refused; the receiver counts it and goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    Short {
        len: usize,
    },
    Magic,
    Version(u8),
    MessageKind(u8),
    /// The header's record count and the datagram's length disagree.
    Length {
        count: usize,
        len: usize,
    },
    TooManyRecords(usize),
    RecordKind(u8),
    Protocol(u8),
    ReversedBlock {
        first: u16,
        last: u16,
    },
    /// A field this version leaves zero is not.
    Reserved,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Short { len } => write!(f, "{len} bytes is shorter than the {HEADER_LEN}-byte header"),
            DecodeError::Magic => write!(f, "not a natrix sync datagram (no 'NX' magic)"),
            DecodeError::Version(v) => write!(f, "version {v}; this natrix speaks version {VERSION}"),
            DecodeError::MessageKind(k) => write!(f, "unknown message kind {k}"),
            DecodeError::Length { count, len } => write!(f, "header says {count} records but the datagram is {len} bytes"),
            DecodeError::TooManyRecords(n) => write!(f, "{n} records; at most {MAX_RECORDS} fit a datagram"),
            DecodeError::RecordKind(k) => write!(f, "unknown record kind {k}"),
            DecodeError::Protocol(p) => write!(f, "protocol {p} is not one natrix translates"),
            DecodeError::ReversedBlock { first, last } => write!(f, "port range {first}-{last} is reversed"),
            DecodeError::Reserved => write!(f, "a reserved field is not zero"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl Message {
    pub fn encode(&self) -> Vec<u8> {
        let (kind, session, sequence, field, before, records): (u8, u32, u32, u32, u32, &[Record]) = match self {
            Message::Data { session, sequence, base, before, records } => (KIND_DATA, *session, *sequence, *base, *before, records),
            Message::Ack { session, ack } => (KIND_ACK, *session, 0, *ack, 0, &[]),
            Message::Alive { session, next, base, before } => (KIND_ALIVE, *session, *next, *base, *before, &[]),
            Message::Resync { session } => (KIND_RESYNC, *session, 0, 0, 0, &[]),
        };
        debug_assert!(records.len() <= MAX_RECORDS);
        let mut out = Vec::with_capacity(HEADER_LEN + records.len() * RECORD_LEN);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&session.to_be_bytes());
        out.extend_from_slice(&sequence.to_be_bytes());
        out.extend_from_slice(&field.to_be_bytes());
        out.extend_from_slice(&(records.len() as u16).to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&before.to_be_bytes());
        for r in records {
            r.encode(&mut out);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Message, DecodeError> {
        if b.len() < HEADER_LEN {
            return Err(DecodeError::Short { len: b.len() });
        }
        if b[0..2] != MAGIC {
            return Err(DecodeError::Magic);
        }
        if b[2] != VERSION {
            return Err(DecodeError::Version(b[2]));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (session, sequence, field, before) = (u32_at(4), u32_at(8), u32_at(12), u32_at(20));
        let count = usize::from(u16::from_be_bytes([b[16], b[17]]));
        let unused = match b[3] {
            KIND_ACK => sequence != 0 || before != 0,
            KIND_RESYNC => sequence != 0 || field != 0 || before != 0,
            _ => false,
        };
        if b[18..20] != [0, 0] || unused {
            return Err(DecodeError::Reserved);
        }
        match b[3] {
            KIND_ACK if count == 0 && b.len() == HEADER_LEN => Ok(Message::Ack { session, ack: field }),
            KIND_ACK => Err(DecodeError::Length { count, len: b.len() }),
            KIND_ALIVE if count == 0 && b.len() == HEADER_LEN => Ok(Message::Alive { session, next: sequence, base: field, before }),
            KIND_ALIVE => Err(DecodeError::Length { count, len: b.len() }),
            KIND_RESYNC if count == 0 && b.len() == HEADER_LEN => Ok(Message::Resync { session }),
            KIND_RESYNC => Err(DecodeError::Length { count, len: b.len() }),
            KIND_DATA => {
                if count > MAX_RECORDS {
                    return Err(DecodeError::TooManyRecords(count));
                }
                if b.len() != HEADER_LEN + count * RECORD_LEN {
                    return Err(DecodeError::Length { count, len: b.len() });
                }
                let records = b[HEADER_LEN..].chunks_exact(RECORD_LEN).map(|c| Record::decode(c.try_into().expect("chunks_exact"))).collect::<Result<_, _>>()?;
                Ok(Message::Data { session, sequence, base: field, before, records })
            }
            k => Err(DecodeError::MessageKind(k)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_softwire_hosts_events_are_not_synced() {
        let plain = natrix_engine::Event {
            kind: EventKind::MappingCreated,
            time_ns: 0,
            proto: Proto::Udp,
            int_addr: 0xc000_0002,
            int_port: 5000,
            ext_addr: 0xcb00_7101,
            ext_port: 31000,
            ext_port_end: 31000,
            rem_addr: 0,
            rem_port: 0,
            b4: None,
        };
        assert!(Record::of_event(&plain).is_some());
        let softwire = natrix_engine::Event { b4: Some("2001:db8:100::2".parse().unwrap()), ..plain };
        assert_eq!(Record::of_event(&softwire), None, "192.0.0.2 behind a B4 is not the subscriber 192.0.0.2");
    }

    pub fn record() -> impl Strategy<Value = Record> {
        (0..RecordKind::ALL.len(), 0..Proto::ALL.len(), any::<u32>(), any::<u16>(), any::<u32>(), any::<u16>(), any::<u16>(), any::<u32>(), any::<u16>()).prop_map(
            |(k, p, int_addr, int_port, ext_addr, a, b, rem_addr, rem_port)| Record {
                kind: RecordKind::ALL[k],
                proto: Proto::ALL[p],
                int_addr,
                int_port,
                ext_addr,
                ext_port: a.min(b),
                ext_port_end: a.max(b),
                rem_addr,
                rem_port,
            },
        )
    }

    #[test]
    fn a_record_is_laid_out_as_the_diagram_says() {
        let r = Record {
            kind: RecordKind::BlockAllocated,
            proto: Proto::Udp,
            int_addr: 0x6440_0005,
            int_port: 0,
            ext_addr: 0xcb00_7101,
            ext_port: 2048,
            ext_port_end: 2111,
            rem_addr: 0,
            rem_port: 0,
        };
        let m = Message::Data { session: 7, sequence: 9, base: 3, before: 300, records: vec![r] }.encode();
        assert_eq!(&m[..HEADER_LEN], &[b'N', b'X', 1, 1, 0, 0, 0, 7, 0, 0, 0, 9, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 1, 44]);
        assert_eq!(&m[HEADER_LEN..], &[5, 17, 0, 0, 100, 64, 0, 5, 203, 0, 113, 1, 0x08, 0x00, 0x08, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(MAX_RECORDS, 57);
    }

    #[test]
    fn bad_datagrams_are_refused_with_the_reason() {
        let good = Message::Data { session: 1, sequence: 1, base: 1, before: 0, records: vec![] }.encode();
        assert_eq!(Message::decode(&good[..23]), Err(DecodeError::Short { len: 23 }));
        let mut m = good.clone();
        m[0] = b'X';
        assert_eq!(Message::decode(&m), Err(DecodeError::Magic));
        let mut m = good.clone();
        m[2] = 2;
        assert_eq!(Message::decode(&m), Err(DecodeError::Version(2)));
        let mut m = good.clone();
        m[3] = 9;
        assert_eq!(Message::decode(&m), Err(DecodeError::MessageKind(9)));
        let mut m = Message::Alive { session: 1, next: 2, base: 2, before: 5 }.encode();
        m.extend_from_slice(&[0; RECORD_LEN]);
        assert_eq!(Message::decode(&m), Err(DecodeError::Length { count: 0, len: HEADER_LEN + RECORD_LEN }));
        let mut m = good.clone();
        m[17] = 1;
        assert_eq!(Message::decode(&m), Err(DecodeError::Length { count: 1, len: HEADER_LEN }));
        let mut m = good.clone();
        m[16] = 1;
        assert_eq!(Message::decode(&m), Err(DecodeError::TooManyRecords(256)));
        let mut m = good;
        m[17] = 1;
        m.extend_from_slice(&[9; RECORD_LEN]);
        assert_eq!(Message::decode(&m), Err(DecodeError::RecordKind(9)));
        m[HEADER_LEN] = 1;
        assert_eq!(Message::decode(&m), Err(DecodeError::Protocol(9)));
        m[HEADER_LEN + 1] = 6;
        assert_eq!(Message::decode(&m), Err(DecodeError::Reserved));
        m[HEADER_LEN + 22..].fill(0);
        m[HEADER_LEN + 14..HEADER_LEN + 16].fill(0);
        assert_eq!(Message::decode(&m), Err(DecodeError::ReversedBlock { first: 0x0909, last: 0 }));
        m[HEADER_LEN + 14..HEADER_LEN + 16].fill(9);
        assert!(Message::decode(&m).is_ok());
    }

    proptest! {
        /// A record becomes the event it was made of, and back.
        #[test]
        fn records_and_events_convert_both_ways(r in record()) {
            prop_assert_eq!(Record::of_event(&r.to_event()), Some(r));
        }

        #[test]
        fn messages_decode_to_what_was_encoded(session in any::<u32>(), sequence in any::<u32>(), base in any::<u32>(), before in any::<u32>(), records in proptest::collection::vec(record(), 0..=MAX_RECORDS)) {
            let m = Message::Data { session, sequence, base, before, records };
            prop_assert_eq!(Message::decode(&m.encode()), Ok(m));
            let a = Message::Ack { session, ack: sequence };
            prop_assert_eq!(Message::decode(&a.encode()), Ok(a));
            let h = Message::Alive { session, next: sequence, base, before };
            prop_assert_eq!(Message::decode(&h.encode()), Ok(h));
            let r = Message::Resync { session };
            prop_assert_eq!(Message::decode(&r.encode()), Ok(r));
        }

        /// Whatever arrives, decoding answers without panicking, and every
        /// datagram it accepts encodes back to the same bytes.
        #[test]
        fn any_bytes_are_refused_or_round_trip(kind in 0u8..6, count in 0u8..3, rest in proptest::collection::vec(any::<u8>(), 0..100)) {
            // Mostly well-formed headers, so that decoding gets past the magic.
            let mut bytes = vec![b'N', b'X', VERSION, kind];
            bytes.extend_from_slice(&rest[..rest.len().min(12)]);
            bytes.extend_from_slice(&[0, count, 0, 0]);
            bytes.extend_from_slice(&rest[rest.len().min(12)..]);
            if (kind == 2 || kind == 4) && bytes.len() >= HEADER_LEN {
                // An ACK's sequence and `before` are zero, as its encoder writes them; a RESYNC's base too.
                bytes[8..12].fill(0);
                bytes[20..24].fill(0);
                if kind == 4 {
                    bytes[12..16].fill(0);
                }
            }
            if let Ok(m) = Message::decode(&bytes) {
                prop_assert_eq!(m.encode(), bytes);
            }
        }
    }
}
