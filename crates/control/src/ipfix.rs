//! NAT events exported as IPFIX (RFC 7011) over UDP, with the NAT
//! information elements of RFC 8158. The [`Encoder`] is pure (events in,
//! messages out); the [`IpfixExporter`] sends its messages from a
//! non-blocking socket and counts every record it could not hand over as
//! lost, so a slow or absent collector never holds up anything else.
//!
//! One template per record shape, sent before the first data and again
//! every [`TEMPLATE_REFRESH_S`] seconds or [`TEMPLATE_REFRESH_MESSAGES`]
//! messages (UDP has no other way to tell a restarted collector):
//!
//! | id  | natEvent            | fields |
//! |-----|---------------------|--------|
//! | 256 | 8, 9 (BIB)          | time, natEvent, protocol, source address and port, post-NAT source address and port |
//! | 257 | 4, 5 (session)      | the above, plus destination address and port and their post-NAT values (unchanged by NAT44) |
//! | 258 | 16, 17 (port block) | time, natEvent, protocol, source address, post-NAT source address, portRangeStart/End/StepSize/NumPorts |
//! | 259 | 3, 12, 13 (limits)  | time, natEvent, protocol, source address and port, post-NAT source address (0.0.0.0 when none was chosen) |

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use natrix_engine::{Event, EventKind};

use crate::config::LogUnit;
use crate::eventlog::records_event;

/// IPFIX information element numbers (IANA registry).
pub mod ie {
    pub const PROTOCOL_IDENTIFIER: u16 = 4;
    pub const SOURCE_IPV6_ADDRESS: u16 = 27;
    pub const SOURCE_TRANSPORT_PORT: u16 = 7;
    pub const SOURCE_IPV4_ADDRESS: u16 = 8;
    pub const DESTINATION_TRANSPORT_PORT: u16 = 11;
    pub const DESTINATION_IPV4_ADDRESS: u16 = 12;
    pub const POST_NAT_SOURCE_IPV4_ADDRESS: u16 = 225;
    pub const POST_NAT_DESTINATION_IPV4_ADDRESS: u16 = 226;
    pub const POST_NAPT_SOURCE_TRANSPORT_PORT: u16 = 227;
    pub const POST_NAPT_DESTINATION_TRANSPORT_PORT: u16 = 228;
    pub const NAT_EVENT: u16 = 230;
    pub const OBSERVATION_TIME_MILLISECONDS: u16 = 323;
    pub const PORT_RANGE_START: u16 = 361;
    pub const PORT_RANGE_END: u16 = 362;
    pub const PORT_RANGE_STEP_SIZE: u16 = 363;
    pub const PORT_RANGE_NUM_PORTS: u16 = 364;
}

pub const VERSION: u16 = 10;
pub const TEMPLATE_SET_ID: u16 = 2;
pub const TEMPLATE_MAPPING: u16 = 256;
pub const TEMPLATE_SESSION: u16 = 257;
pub const TEMPLATE_BLOCK: u16 = 258;
pub const TEMPLATE_LIMIT: u16 = 259;
/// A DS-Lite host's records (RFC 6333): the IPv4 templates with the B4's
/// address, sourceIPv6Address, after the host's sourceIPv4Address.
pub const TEMPLATE_SOFTWIRE_MAPPING: u16 = 260;
pub const TEMPLATE_SOFTWIRE_SESSION: u16 = 261;
pub const TEMPLATE_SOFTWIRE_BLOCK: u16 = 262;
pub const TEMPLATE_SOFTWIRE_LIMIT: u16 = 263;
/// Whole messages stay under a typical path MTU, so none is fragmented.
pub const MAX_MESSAGE: usize = 1400;
pub const TEMPLATE_REFRESH_S: u32 = 60;
pub const TEMPLATE_REFRESH_MESSAGES: u32 = 128;
pub const OBSERVATION_DOMAIN: u32 = 1;

const HEADER_LEN: usize = 16;
const SET_HEADER_LEN: usize = 4;

use ie::*;

/// (information element, length in bytes) of each field, in record order.
type Fields = &'static [(u16, u16)];

const MAPPING_FIELDS: Fields = &[
    (OBSERVATION_TIME_MILLISECONDS, 8),
    (NAT_EVENT, 1),
    (PROTOCOL_IDENTIFIER, 1),
    (SOURCE_IPV4_ADDRESS, 4),
    (SOURCE_TRANSPORT_PORT, 2),
    (POST_NAT_SOURCE_IPV4_ADDRESS, 4),
    (POST_NAPT_SOURCE_TRANSPORT_PORT, 2),
];
const SESSION_FIELDS: Fields = &[
    (OBSERVATION_TIME_MILLISECONDS, 8),
    (NAT_EVENT, 1),
    (PROTOCOL_IDENTIFIER, 1),
    (SOURCE_IPV4_ADDRESS, 4),
    (SOURCE_TRANSPORT_PORT, 2),
    (POST_NAT_SOURCE_IPV4_ADDRESS, 4),
    (POST_NAPT_SOURCE_TRANSPORT_PORT, 2),
    (DESTINATION_IPV4_ADDRESS, 4),
    (DESTINATION_TRANSPORT_PORT, 2),
    (POST_NAT_DESTINATION_IPV4_ADDRESS, 4),
    (POST_NAPT_DESTINATION_TRANSPORT_PORT, 2),
];
const BLOCK_FIELDS: Fields = &[
    (OBSERVATION_TIME_MILLISECONDS, 8),
    (NAT_EVENT, 1),
    (PROTOCOL_IDENTIFIER, 1),
    (SOURCE_IPV4_ADDRESS, 4),
    (POST_NAT_SOURCE_IPV4_ADDRESS, 4),
    (PORT_RANGE_START, 2),
    (PORT_RANGE_END, 2),
    (PORT_RANGE_STEP_SIZE, 2),
    (PORT_RANGE_NUM_PORTS, 2),
];
const LIMIT_FIELDS: Fields =
    &[(OBSERVATION_TIME_MILLISECONDS, 8), (NAT_EVENT, 1), (PROTOCOL_IDENTIFIER, 1), (SOURCE_IPV4_ADDRESS, 4), (SOURCE_TRANSPORT_PORT, 2), (POST_NAT_SOURCE_IPV4_ADDRESS, 4)];

const B4: (u16, u16) = (SOURCE_IPV6_ADDRESS, 16);
const SOFTWIRE_MAPPING_FIELDS: Fields = &[
    (OBSERVATION_TIME_MILLISECONDS, 8),
    (NAT_EVENT, 1),
    (PROTOCOL_IDENTIFIER, 1),
    (SOURCE_IPV4_ADDRESS, 4),
    B4,
    (SOURCE_TRANSPORT_PORT, 2),
    (POST_NAT_SOURCE_IPV4_ADDRESS, 4),
    (POST_NAPT_SOURCE_TRANSPORT_PORT, 2),
];
const SOFTWIRE_SESSION_FIELDS: Fields = &[
    (OBSERVATION_TIME_MILLISECONDS, 8),
    (NAT_EVENT, 1),
    (PROTOCOL_IDENTIFIER, 1),
    (SOURCE_IPV4_ADDRESS, 4),
    B4,
    (SOURCE_TRANSPORT_PORT, 2),
    (POST_NAT_SOURCE_IPV4_ADDRESS, 4),
    (POST_NAPT_SOURCE_TRANSPORT_PORT, 2),
    (DESTINATION_IPV4_ADDRESS, 4),
    (DESTINATION_TRANSPORT_PORT, 2),
    (POST_NAT_DESTINATION_IPV4_ADDRESS, 4),
    (POST_NAPT_DESTINATION_TRANSPORT_PORT, 2),
];
const SOFTWIRE_BLOCK_FIELDS: Fields = &[
    (OBSERVATION_TIME_MILLISECONDS, 8),
    (NAT_EVENT, 1),
    (PROTOCOL_IDENTIFIER, 1),
    (SOURCE_IPV4_ADDRESS, 4),
    B4,
    (POST_NAT_SOURCE_IPV4_ADDRESS, 4),
    (PORT_RANGE_START, 2),
    (PORT_RANGE_END, 2),
    (PORT_RANGE_STEP_SIZE, 2),
    (PORT_RANGE_NUM_PORTS, 2),
];
const SOFTWIRE_LIMIT_FIELDS: Fields =
    &[(OBSERVATION_TIME_MILLISECONDS, 8), (NAT_EVENT, 1), (PROTOCOL_IDENTIFIER, 1), (SOURCE_IPV4_ADDRESS, 4), B4, (SOURCE_TRANSPORT_PORT, 2), (POST_NAT_SOURCE_IPV4_ADDRESS, 4)];

/// Every template natrix uses, by id.
pub const TEMPLATES: [(u16, Fields); 8] = [
    (TEMPLATE_MAPPING, MAPPING_FIELDS),
    (TEMPLATE_SESSION, SESSION_FIELDS),
    (TEMPLATE_BLOCK, BLOCK_FIELDS),
    (TEMPLATE_LIMIT, LIMIT_FIELDS),
    (TEMPLATE_SOFTWIRE_MAPPING, SOFTWIRE_MAPPING_FIELDS),
    (TEMPLATE_SOFTWIRE_SESSION, SOFTWIRE_SESSION_FIELDS),
    (TEMPLATE_SOFTWIRE_BLOCK, SOFTWIRE_BLOCK_FIELDS),
    (TEMPLATE_SOFTWIRE_LIMIT, SOFTWIRE_LIMIT_FIELDS),
];

/// The template of the event's record: by its kind, and the softwire
/// variant when it names a B4.
pub fn template_for(e: &Event) -> u16 {
    use EventKind::*;
    let ipv4 = match e.kind {
        MappingCreated | MappingDeleted => TEMPLATE_MAPPING,
        SessionCreated | SessionDeleted => TEMPLATE_SESSION,
        BlockAllocated | BlockReleased => TEMPLATE_BLOCK,
        AddressesExhausted | PortsExhausted | QuotaExceeded => TEMPLATE_LIMIT,
    };
    if e.b4.is_some() {
        ipv4 + (TEMPLATE_SOFTWIRE_MAPPING - TEMPLATE_MAPPING)
    } else {
        ipv4
    }
}

fn fields_of(template: u16) -> Fields {
    TEMPLATES.iter().find(|(id, _)| *id == template).map(|(_, f)| *f).expect("one of natrix's templates")
}

fn record_len(template: u16) -> usize {
    fields_of(template).iter().map(|&(_, len)| usize::from(len)).sum()
}

/// The value of one field of the event's record.
fn value(e: &Event, element: u16) -> u64 {
    match element {
        OBSERVATION_TIME_MILLISECONDS => e.time_ns / 1_000_000,
        NAT_EVENT => e.kind as u64,
        PROTOCOL_IDENTIFIER => u64::from(e.proto.ip_number()),
        SOURCE_IPV4_ADDRESS => u64::from(e.int_addr),
        SOURCE_TRANSPORT_PORT => u64::from(e.int_port),
        POST_NAT_SOURCE_IPV4_ADDRESS => u64::from(e.ext_addr),
        POST_NAPT_SOURCE_TRANSPORT_PORT | PORT_RANGE_START => u64::from(e.ext_port),
        PORT_RANGE_END => u64::from(e.ext_port_end),
        PORT_RANGE_STEP_SIZE => 1,
        PORT_RANGE_NUM_PORTS => u64::from(e.ext_port_end.saturating_sub(e.ext_port)) + 1,
        // NAT44 leaves the destination as it is.
        DESTINATION_IPV4_ADDRESS | POST_NAT_DESTINATION_IPV4_ADDRESS => u64::from(e.rem_addr),
        DESTINATION_TRANSPORT_PORT | POST_NAPT_DESTINATION_TRANSPORT_PORT => u64::from(e.rem_port),
        _ => 0,
    }
}

/// A finished IPFIX message and the number of data records in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub bytes: Vec<u8>,
    pub records: u32,
}

/// Builds IPFIX messages: data records are appended to the message being
/// built (consecutive records of one template share a set) until the next
/// would not fit; `finish` then closes it.
pub struct Encoder {
    domain: u32,
    max_len: usize,
    /// Data records in finished messages (the header's sequence number).
    seq: u32,
    msg: Vec<u8>,
    set_start: usize,
    set_id: u16,
    records: u32,
}

impl Encoder {
    pub fn new(domain: u32) -> Self {
        Self::with_max_len(domain, MAX_MESSAGE)
    }

    pub fn with_max_len(domain: u32, max_len: usize) -> Self {
        assert!(max_len >= HEADER_LEN + SET_HEADER_LEN + record_len(TEMPLATE_SOFTWIRE_SESSION));
        Encoder { domain, max_len, seq: 0, msg: Vec::new(), set_start: 0, set_id: 0, records: 0 }
    }

    /// A message holding every template (it carries no data records, so it
    /// does not advance the sequence number).
    pub fn template_message(&self, export_s: u32) -> Vec<u8> {
        let mut m = Vec::with_capacity(256);
        put_header(&mut m, export_s, self.seq, self.domain);
        let set = m.len();
        put16(&mut m, TEMPLATE_SET_ID);
        put16(&mut m, 0);
        for (id, fields) in TEMPLATES {
            put16(&mut m, id);
            put16(&mut m, fields.len() as u16);
            for &(element, len) in fields {
                put16(&mut m, element);
                put16(&mut m, len);
            }
        }
        let set_len = (m.len() - set) as u16;
        m[set + 2..set + 4].copy_from_slice(&set_len.to_be_bytes());
        let len = m.len() as u16;
        m[2..4].copy_from_slice(&len.to_be_bytes());
        m
    }

    /// Whether the event's record fits in the message being built.
    pub fn fits(&self, e: &Event) -> bool {
        let t = template_for(e);
        let used = if self.msg.is_empty() { HEADER_LEN } else { self.msg.len() };
        let set_header = if !self.msg.is_empty() && self.set_id == t { 0 } else { SET_HEADER_LEN };
        used + set_header + record_len(t) <= self.max_len
    }

    /// Appends the event's record; the caller finishes the message first
    /// when it does not [`fit`](Self::fits).
    pub fn add(&mut self, e: &Event) {
        debug_assert!(self.fits(e));
        let t = template_for(e);
        if self.msg.is_empty() {
            self.msg.reserve(self.max_len);
            put_header(&mut self.msg, 0, 0, self.domain);
            self.set_id = 0;
        }
        if self.set_id != t {
            self.close_set();
            self.set_start = self.msg.len();
            self.set_id = t;
            put16(&mut self.msg, t);
            put16(&mut self.msg, 0);
        }
        for &(element, len) in fields_of(t) {
            if element == SOURCE_IPV6_ADDRESS {
                self.msg.extend_from_slice(&e.b4.unwrap_or(std::net::Ipv6Addr::UNSPECIFIED).octets());
                continue;
            }
            let v = value(e, element);
            self.msg.extend_from_slice(&v.to_be_bytes()[8 - usize::from(len)..]);
        }
        self.records += 1;
    }

    /// Data records in the message being built.
    pub fn pending(&self) -> u32 {
        self.records
    }

    /// Closes the message being built, if it holds any record.
    pub fn finish(&mut self, export_s: u32) -> Option<Message> {
        if self.records == 0 {
            return None;
        }
        self.close_set();
        let mut bytes = std::mem::take(&mut self.msg);
        let len = bytes.len() as u16;
        bytes[2..4].copy_from_slice(&len.to_be_bytes());
        bytes[4..8].copy_from_slice(&export_s.to_be_bytes());
        bytes[8..12].copy_from_slice(&self.seq.to_be_bytes());
        let records = std::mem::take(&mut self.records);
        self.seq = self.seq.wrapping_add(records);
        self.set_id = 0;
        Some(Message { bytes, records })
    }

    fn close_set(&mut self) {
        if self.set_id != 0 {
            let len = (self.msg.len() - self.set_start) as u16;
            self.msg[self.set_start + 2..self.set_start + 4].copy_from_slice(&len.to_be_bytes());
        }
    }
}

fn put16(m: &mut Vec<u8>, v: u16) {
    m.extend_from_slice(&v.to_be_bytes());
}

fn put_header(m: &mut Vec<u8>, export_s: u32, seq: u32, domain: u32) {
    put16(m, VERSION);
    put16(m, 0); // length, filled in when the message is complete
    m.extend_from_slice(&export_s.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&domain.to_be_bytes());
}

/// Where export times and the template refresh interval come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The events' own times: `replay` exports as the capture's time passes,
    /// so the same input gives the same messages.
    Events,
    /// The system clock (live).
    Wall,
}

/// A shared count of records that a sink had to drop.
pub type LossCounter = Arc<AtomicU64>;

/// What one sink has handed over (records and bytes) and dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkStats {
    pub records: u64,
    pub bytes: u64,
    pub messages: u64,
    pub lost: u64,
}

/// Sends IPFIX messages to one collector over UDP. Nothing here blocks: a
/// message the socket does not take at once (buffer full, collector
/// refusing, no route) is dropped and its records counted as lost.
pub struct IpfixExporter {
    sock: UdpSocket,
    enc: Encoder,
    unit: LogUnit,
    clock: Clock,
    latest_event_s: u32,
    /// Export time of the last template message delivered; `None`: templates are due.
    templates_at: Option<u32>,
    messages_since_templates: u32,
    /// Data records in the last datagram the socket took (0 for templates).
    last_sent: u32,
    stats: SinkStats,
    lost: LossCounter,
}

impl IpfixExporter {
    pub fn connect(collector: SocketAddr, unit: LogUnit, clock: Clock, lost: LossCounter) -> io::Result<Self> {
        let local: SocketAddr = if collector.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
        let sock = UdpSocket::bind(local)?;
        sock.connect(collector)?;
        sock.set_nonblocking(true)?;
        Ok(IpfixExporter {
            sock,
            enc: Encoder::new(OBSERVATION_DOMAIN),
            unit,
            clock,
            latest_event_s: 0,
            templates_at: None,
            messages_since_templates: 0,
            last_sent: 0,
            stats: SinkStats::default(),
            lost,
        })
    }

    /// Queues the event's record if the unit records it; sends the message
    /// being built first when the record does not fit in it.
    pub fn write(&mut self, e: &Event) {
        if !records_event(self.unit, e) {
            return;
        }
        self.latest_event_s = self.latest_event_s.max((e.time_ns / 1_000_000_000) as u32);
        if !self.enc.fits(e) {
            self.flush();
        }
        self.enc.add(e);
    }

    /// Sends the message being built, preceded by the templates when they are due.
    pub fn flush(&mut self) {
        if self.enc.pending() == 0 {
            return;
        }
        let now = self.now_s();
        let due = match self.templates_at {
            None => true,
            Some(at) => now.saturating_sub(at) >= TEMPLATE_REFRESH_S || self.messages_since_templates >= TEMPLATE_REFRESH_MESSAGES,
        };
        // Built before the data message is finished: its sequence number
        // counts the records sent before it.
        let templates = due.then(|| self.enc.template_message(now));
        let msg = self.enc.finish(now).expect("records are pending");
        if let Some(t) = templates {
            match self.sock.send(&t) {
                Ok(n) => {
                    self.stats.bytes += n as u64;
                    self.stats.messages += 1;
                    self.templates_at = Some(now);
                    self.messages_since_templates = 0;
                    self.last_sent = 0;
                }
                Err(e) => {
                    // Data the collector cannot decode is as good as lost.
                    self.send_failed(&e);
                    self.count_lost(msg.records);
                    return;
                }
            }
        }
        // The sequence number advanced even if this message is lost: the
        // collector sees the gap too.
        match self.sock.send(&msg.bytes) {
            Ok(n) => {
                self.stats.records += u64::from(msg.records);
                self.stats.bytes += n as u64;
                self.stats.messages += 1;
                self.messages_since_templates += 1;
                self.last_sent = msg.records;
            }
            Err(e) => {
                self.send_failed(&e);
                self.count_lost(msg.records);
            }
        }
    }

    fn send_failed(&mut self, e: &io::Error) {
        // The collector may come back as a new process: send it the templates again.
        self.templates_at = None;
        if e.kind() == io::ErrorKind::ConnectionRefused {
            // The kernel reports an ICMP port unreachable on the send after
            // the datagram that drew it: that one was lost too.
            let refused = std::mem::take(&mut self.last_sent);
            self.stats.records -= u64::from(refused);
            self.count_lost(refused);
        }
    }

    pub fn stats(&self) -> SinkStats {
        self.stats
    }

    fn count_lost(&mut self, n: u32) {
        self.stats.lost += u64::from(n);
        self.lost.fetch_add(u64::from(n), Ordering::Relaxed);
    }

    fn now_s(&self) -> u32 {
        match self.clock {
            Clock::Events => self.latest_event_s,
            Clock::Wall => SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eventlog::records;
    use natrix_engine::Proto;
    use std::collections::HashMap;
    use std::time::Duration;

    fn ip(s: &str) -> u32 {
        u32::from(s.parse::<Ipv4Addr>().unwrap())
    }

    fn mapping(kind: EventKind, t_ms: u64, port: u16) -> Event {
        Event {
            kind,
            time_ns: t_ms * 1_000_000,
            proto: Proto::Udp,
            int_addr: ip("100.64.0.10"),
            int_port: port,
            ext_addr: ip("203.0.113.1"),
            ext_port: port + 1,
            ext_port_end: port + 1,
            rem_addr: 0,
            rem_port: 0,
            b4: None,
        }
    }

    /// A minimal decoder written from RFC 7011 section 3: header, sets,
    /// templates, data records as (element -> value) maps.
    struct Decoded {
        export_s: u32,
        seq: u32,
        domain: u32,
        templates: HashMap<u16, Vec<(u16, u16)>>,
        records: Vec<(u16, HashMap<u16, u64>)>,
    }

    fn decode(m: &[u8], known: &HashMap<u16, Vec<(u16, u16)>>) -> Decoded {
        let be16 = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
        let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(be16(&m[0..]), 10, "version");
        assert_eq!(usize::from(be16(&m[2..])), m.len(), "message length");
        let mut d = Decoded { export_s: be32(&m[4..]), seq: be32(&m[8..]), domain: be32(&m[12..]), templates: HashMap::new(), records: Vec::new() };
        let mut pos = 16;
        while pos < m.len() {
            let (id, len) = (be16(&m[pos..]), usize::from(be16(&m[pos + 2..])));
            assert!(len >= 4 && pos + len <= m.len(), "set length");
            let body = &m[pos + 4..pos + len];
            if id == TEMPLATE_SET_ID {
                let mut p = 0;
                while p + 4 <= body.len() {
                    let (tid, n) = (be16(&body[p..]), usize::from(be16(&body[p + 2..])));
                    p += 4;
                    let fields = (0..n).map(|i| (be16(&body[p + 4 * i..]), be16(&body[p + 4 * i + 2..]))).collect();
                    p += 4 * n;
                    d.templates.insert(tid, fields);
                }
            } else {
                assert!(id >= 256, "data set id");
                let fields = known.get(&id).or_else(|| d.templates.get(&id)).expect("template known before its data");
                let rlen: usize = fields.iter().map(|&(_, l)| usize::from(l)).sum();
                assert_eq!(body.len() % rlen, 0, "no padding expected");
                for r in body.chunks(rlen) {
                    let mut rec = HashMap::new();
                    let mut p = 0;
                    for &(element, l) in fields {
                        let v = r[p..p + usize::from(l)].iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b));
                        rec.insert(element, v);
                        p += usize::from(l);
                    }
                    d.records.push((id, rec));
                }
            }
            pos += len;
        }
        d
    }

    fn templates() -> HashMap<u16, Vec<(u16, u16)>> {
        decode(&Encoder::new(7).template_message(0), &HashMap::new()).templates
    }

    #[test]
    fn template_message_lists_every_shape() {
        let enc = Encoder::new(7);
        let d = decode(&enc.template_message(1234), &HashMap::new());
        assert_eq!((d.export_s, d.seq, d.domain), (1234, 0, 7));
        assert!(d.records.is_empty());
        assert_eq!(d.templates.len(), 8);
        let mapping = &d.templates[&TEMPLATE_MAPPING];
        assert_eq!(mapping.iter().map(|f| f.0).collect::<Vec<_>>(), vec![323, 230, 4, 8, 7, 225, 227]);
        let softwire = &d.templates[&TEMPLATE_SOFTWIRE_MAPPING];
        assert_eq!(softwire.iter().map(|f| f.0).collect::<Vec<_>>(), vec![323, 230, 4, 8, 27, 7, 225, 227], "RFC 6333 hosts: the B4 as sourceIPv6Address");
        assert!(softwire.contains(&(27, 16)));
        assert!(d.templates[&TEMPLATE_BLOCK].contains(&(361, 2)) && d.templates[&TEMPLATE_BLOCK].contains(&(362, 2)));
        assert!(d.templates[&TEMPLATE_SESSION].contains(&(12, 4)) && d.templates[&TEMPLATE_SESSION].contains(&(11, 2)));
    }

    #[test]
    fn records_decode_field_by_field() {
        let mut enc = Encoder::new(1);
        let create = mapping(EventKind::MappingCreated, 1_767_225_600_175, 40000);
        let session = Event { kind: EventKind::SessionCreated, rem_addr: ip("198.51.100.20"), rem_port: 53, ..create };
        let block = Event { kind: EventKind::BlockAllocated, proto: Proto::Tcp, int_port: 0, ext_port: 1024, ext_port_end: 1087, ..create };
        let quota = Event { kind: EventKind::QuotaExceeded, ext_addr: 0, ext_port: 0, ext_port_end: 0, ..create };
        for e in [&create, &session, &block, &quota] {
            assert!(enc.fits(e));
            enc.add(e);
        }
        let m = enc.finish(1_767_225_601).unwrap();
        assert_eq!(m.records, 4);
        let d = decode(&m.bytes, &templates());
        assert_eq!((d.export_s, d.seq, d.domain), (1_767_225_601, 0, 1));
        let ids: Vec<u16> = d.records.iter().map(|r| r.0).collect();
        assert_eq!(ids, vec![TEMPLATE_MAPPING, TEMPLATE_SESSION, TEMPLATE_BLOCK, TEMPLATE_LIMIT]);
        let r = &d.records[0].1;
        assert_eq!(r[&OBSERVATION_TIME_MILLISECONDS], 1_767_225_600_175);
        assert_eq!(r[&NAT_EVENT], 8);
        assert_eq!(r[&PROTOCOL_IDENTIFIER], 17);
        assert_eq!(r[&SOURCE_IPV4_ADDRESS], u64::from(ip("100.64.0.10")));
        assert_eq!(r[&SOURCE_TRANSPORT_PORT], 40000);
        assert_eq!(r[&POST_NAT_SOURCE_IPV4_ADDRESS], u64::from(ip("203.0.113.1")));
        assert_eq!(r[&POST_NAPT_SOURCE_TRANSPORT_PORT], 40001);
        let s = &d.records[1].1;
        assert_eq!(s[&NAT_EVENT], 4);
        assert_eq!((s[&DESTINATION_IPV4_ADDRESS], s[&DESTINATION_TRANSPORT_PORT]), (u64::from(ip("198.51.100.20")), 53));
        assert_eq!((s[&POST_NAT_DESTINATION_IPV4_ADDRESS], s[&POST_NAPT_DESTINATION_TRANSPORT_PORT]), (u64::from(ip("198.51.100.20")), 53));
        let b = &d.records[2].1;
        assert_eq!((b[&NAT_EVENT], b[&PROTOCOL_IDENTIFIER]), (16, 6));
        assert_eq!((b[&PORT_RANGE_START], b[&PORT_RANGE_END], b[&PORT_RANGE_STEP_SIZE], b[&PORT_RANGE_NUM_PORTS]), (1024, 1087, 1, 64));
        let q = &d.records[3].1;
        assert_eq!((q[&NAT_EVENT], q[&POST_NAT_SOURCE_IPV4_ADDRESS], q[&SOURCE_TRANSPORT_PORT]), (13, 0, 40000));
    }

    #[test]
    fn messages_stay_small_and_sequence_counts_records() {
        let mut enc = Encoder::new(1);
        let mut messages = Vec::new();
        for i in 0..1000u16 {
            let kind = if i.is_multiple_of(3) { EventKind::MappingDeleted } else { EventKind::MappingCreated };
            let e = mapping(kind, 1000 + u64::from(i), 2000 + i);
            if !enc.fits(&e) {
                messages.push(enc.finish(5).unwrap());
            }
            enc.add(&e);
        }
        messages.extend(enc.finish(5));
        assert!(enc.finish(5).is_none());
        let t = templates();
        let mut seq = 0u32;
        let mut total = 0;
        for m in &messages {
            assert!(m.bytes.len() <= MAX_MESSAGE);
            let d = decode(&m.bytes, &t);
            assert_eq!(d.seq, seq);
            assert_eq!(d.records.len() as u32, m.records);
            for (k, (_, r)) in d.records.iter().enumerate() {
                let i = total + k as u64;
                assert_eq!(r[&OBSERVATION_TIME_MILLISECONDS], 1000 + i);
                assert_eq!(r[&SOURCE_TRANSPORT_PORT], 2000 + i);
                assert_eq!(r[&NAT_EVENT], if i.is_multiple_of(3) { 9 } else { 8 });
            }
            seq += m.records;
            total += m.records as u64;
        }
        assert_eq!(total, 1000);
        assert!(messages.len() < 1000 / 50, "records are batched: {} messages", messages.len());
    }

    #[test]
    fn block_unit_exports_blocks_not_mappings() {
        assert!(records(LogUnit::Block, EventKind::BlockReleased));
        assert!(!records(LogUnit::Block, EventKind::MappingCreated));
        assert!(!records(LogUnit::Mapping, EventKind::SessionCreated));
        assert!(records(LogUnit::Session, EventKind::SessionDeleted));
        assert!(records(LogUnit::Mapping, EventKind::PortsExhausted));
    }

    #[test]
    fn exporter_sends_templates_first_and_batches() {
        let collector = UdpSocket::bind("127.0.0.1:0").unwrap();
        collector.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let lost = LossCounter::default();
        let mut x = IpfixExporter::connect(collector.local_addr().unwrap(), LogUnit::Mapping, Clock::Events, lost.clone()).unwrap();
        for i in 0..10 {
            x.write(&mapping(EventKind::MappingCreated, 1_767_225_600_000 + i, 3000 + i as u16));
        }
        // Not recorded in mapping mode.
        x.write(&Event { kind: EventKind::SessionCreated, ..mapping(EventKind::MappingCreated, 1_767_225_600_500, 1) });
        x.flush();
        let mut buf = [0u8; 2048];
        let n = collector.recv(&mut buf).unwrap();
        let first = decode(&buf[..n], &HashMap::new());
        assert_eq!(first.templates.len(), 8);
        assert!(first.records.is_empty());
        assert_eq!((first.export_s, first.seq), (1_767_225_600, 0));
        let n = collector.recv(&mut buf).unwrap();
        let data = decode(&buf[..n], &first.templates);
        assert_eq!((data.records.len(), data.seq), (10, 0));
        assert_eq!(x.stats().records, 10);
        assert_eq!(x.stats().messages, 2);
        // Within the refresh interval: data only, numbered on.
        x.write(&mapping(EventKind::MappingDeleted, 1_767_225_630_000, 3000));
        x.flush();
        let n = collector.recv(&mut buf).unwrap();
        let data = decode(&buf[..n], &first.templates);
        assert_eq!((data.records.len(), data.seq, data.export_s), (1, 10, 1_767_225_630));
        // A minute after the last templates: they come again first.
        x.write(&mapping(EventKind::MappingDeleted, 1_767_225_661_000, 3001));
        x.flush();
        let n = collector.recv(&mut buf).unwrap();
        let again = decode(&buf[..n], &HashMap::new());
        assert_eq!((again.templates.len(), again.seq, again.records.len()), (8, 11, 0));
        let n = collector.recv(&mut buf).unwrap();
        assert_eq!(decode(&buf[..n], &again.templates).seq, 11);
        assert_eq!(x.stats().records, 12);
        assert_eq!(lost.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_absent_collector_counts_losses_and_gets_templates_again() {
        // A port nobody listens on: the kernel answers port unreachable,
        // and the connected socket reports it on a later send.
        let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let lost = LossCounter::default();
        let mut x = IpfixExporter::connect(port, LogUnit::Mapping, Clock::Events, lost.clone()).unwrap();
        for round in 0..5u64 {
            x.write(&mapping(EventKind::MappingCreated, 1_000_000 + round, 5000));
            x.flush();
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = x.stats();
        assert!(s.lost > 0, "{s:?}");
        assert_eq!(s.lost, lost.load(Ordering::Relaxed));
        assert_eq!(s.records + s.lost, 5);
        // Every data message follows templates that drew a refusal, or drew one itself.
        assert!(s.records <= 1, "{s:?}");
        assert!(x.templates_at.is_none());
    }

    /// The independent check: tshark's IPFIX (cflow) dissector reads a pcap
    /// of our messages. Skipped where tshark is not installed.
    #[test]
    fn tshark_decodes_our_messages() {
        if std::process::Command::new("tshark").arg("--version").output().is_err() {
            eprintln!("tshark not installed: skipping the independent IPFIX decode");
            return;
        }
        let mut enc = Encoder::new(1);
        let create = mapping(EventKind::MappingCreated, 1_767_225_600_175, 40000);
        let block = Event { kind: EventKind::BlockAllocated, ext_port: 1024, ext_port_end: 1087, ..create };
        enc.add(&create);
        enc.add(&Event { kind: EventKind::MappingDeleted, ..create });
        enc.add(&block);
        let messages = [enc.template_message(1_767_225_601), enc.finish(1_767_225_601).unwrap().bytes];
        let path = std::env::temp_dir().join(format!("natrix-ipfix-{}.pcap", std::process::id()));
        std::fs::write(&path, pcap(&messages, 4739)).unwrap();
        let out = std::process::Command::new("tshark")
            .args(["-r", path.to_str().unwrap(), "-d", "udp.port==4739,cflow", "-T", "fields", "-E", "separator=;"])
            .args(["-e", "cflow.nat_event", "-e", "cflow.srcaddr", "-e", "cflow.srcport", "-e", "cflow.post_natsource_ipv4_address"])
            .args(["-e", "cflow.post_naptsource_transport_port", "-e", "cflow.protocol", "-e", "cflow.port_range_start", "-e", "cflow.port_range_end"])
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let data = lines[1];
        assert!(data.starts_with("8,9,16;100.64.0.10,100.64.0.10,100.64.0.10;40000,40000;"), "{data}");
        assert!(data.ends_with(";203.0.113.1,203.0.113.1,203.0.113.1;40001,40001;17,17,17;1024;1087"), "{data}");
    }

    /// A classic pcap of Ethernet/IPv4/UDP frames carrying the payloads.
    fn pcap(payloads: &[Vec<u8>], port: u16) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        f.extend_from_slice(&2u16.to_le_bytes());
        f.extend_from_slice(&4u16.to_le_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_le_bytes());
        f.extend_from_slice(&1u32.to_le_bytes());
        for (i, p) in payloads.iter().enumerate() {
            let mut frame = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
            let total = (20 + 8 + p.len()) as u16;
            let mut iph = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1];
            iph[2..4].copy_from_slice(&total.to_be_bytes());
            let sum = ip_checksum(&iph);
            iph[10..12].copy_from_slice(&sum.to_be_bytes());
            frame.extend_from_slice(&iph);
            frame.extend_from_slice(&40000u16.to_be_bytes());
            frame.extend_from_slice(&port.to_be_bytes());
            frame.extend_from_slice(&(8 + p.len() as u16).to_be_bytes());
            frame.extend_from_slice(&[0, 0]);
            frame.extend_from_slice(p);
            f.extend_from_slice(&(1_767_225_601u32 + i as u32).to_le_bytes());
            f.extend_from_slice(&0u32.to_le_bytes());
            f.extend_from_slice(&(frame.len() as u32).to_le_bytes());
            f.extend_from_slice(&(frame.len() as u32).to_le_bytes());
            f.extend_from_slice(&frame);
        }
        f
    }

    fn ip_checksum(b: &[u8]) -> u16 {
        let mut s: u32 = b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }
}
