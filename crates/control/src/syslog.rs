//! NAT events as syslog messages (RFC 5424), one per event, over UDP
//! (RFC 5426) or a local unix datagram socket such as `/dev/log`. The
//! fields are those of the JSON event log, both as structured data and as
//! `key=value` pairs in the message text:
//!
//! ```text
//! <134>1 2026-01-01T00:00:00.175Z nat1 natrix 4242 mapping_create [natrix@32473 nat_event="8" proto="udp"
//!   subscriber="100.64.0.10" subscriber_port="40000" external="203.0.113.1" external_port="40000"]
//!   event=mapping_create nat_event=8 proto=udp subscriber=100.64.0.10 subscriber_port=40000 ...
//! ```
//!
//! Facility local0; severity informational, warning for exhaustion and quota
//! events. Sending never blocks: a message the socket does not take at once
//! (buffer full, no listener, no such socket) is counted as lost.

use std::fmt::{self, Write as _};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use natrix_engine::{Event, EventKind};

use crate::config::LogUnit;
use crate::eventlog::records_event;
use crate::eventlog::rfc3339;
use crate::ipfix::{LossCounter, SinkStats};

/// RFC 5424 facility local0.
pub const FACILITY: u8 = 16;
const SEVERITY_WARNING: u8 = 4;
const SEVERITY_INFO: u8 = 6;
/// SD-ID of the structured data: RFC 5612's enterprise number for documentation.
pub const SD_ID: &str = "natrix@32473";
pub const APP_NAME: &str = "natrix";

/// Where syslog messages go: `udp:ADDRESS:PORT` or `unix:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyslogTarget {
    Udp(SocketAddr),
    Unix(PathBuf),
}

impl SyslogTarget {
    pub fn parse(t: &str) -> Result<SyslogTarget, String> {
        const EXPECTED: &str = "expected \"udp:ADDRESS:PORT\" or \"unix:PATH\"";
        if let Some(rest) = t.strip_prefix("udp:") {
            let addr: SocketAddr = rest.parse().map_err(|_| format!("\"{t}\": \"{rest}\" is not ADDRESS:PORT ({EXPECTED})"))?;
            if addr.port() == 0 || addr.ip().is_unspecified() {
                return Err(format!("\"{t}\": not a usable destination"));
            }
            Ok(SyslogTarget::Udp(addr))
        } else if let Some(path) = t.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(format!("\"{t}\": the socket path is empty"));
            }
            Ok(SyslogTarget::Unix(PathBuf::from(path)))
        } else {
            Err(format!("\"{t}\": {EXPECTED}"))
        }
    }
}

impl fmt::Display for SyslogTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyslogTarget::Udp(a) => write!(f, "udp:{a}"),
            SyslogTarget::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// The event's fields, named as in the JSON event log.
pub fn fields(e: &Event) -> Vec<(&'static str, String)> {
    let is_block = matches!(e.kind, EventKind::BlockAllocated | EventKind::BlockReleased);
    let is_session = matches!(e.kind, EventKind::SessionCreated | EventKind::SessionDeleted);
    let mut f = vec![
        ("event", e.kind.name().to_owned()),
        ("nat_event", (e.kind as u8).to_string()),
        ("proto", e.proto.name().to_owned()),
        ("subscriber", Ipv4Addr::from(e.int_addr).to_string()),
    ];
    // A DS-Lite host's address is its B4's to tell apart (RFC 6333).
    if let Some(b4) = e.b4 {
        f.push(("b4", b4.to_string()));
    }
    if !is_block {
        f.push(("subscriber_port", e.int_port.to_string()));
    }
    if e.ext_addr != 0 {
        f.push(("external", Ipv4Addr::from(e.ext_addr).to_string()));
        f.push(("external_port", e.ext_port.to_string()));
    }
    if is_block {
        f.push(("port_range_end", e.ext_port_end.to_string()));
    }
    if is_session {
        if e.rem_addr != 0 {
            f.push(("remote", Ipv4Addr::from(e.rem_addr).to_string()));
        }
        f.push(("remote_port", e.rem_port.to_string()));
    }
    f
}

/// One RFC 5424 message for the event (no trailing newline).
pub fn format(e: &Event, hostname: &str, procid: u32) -> String {
    let severity = match e.kind {
        EventKind::AddressesExhausted | EventKind::PortsExhausted | EventKind::QuotaExceeded => SEVERITY_WARNING,
        _ => SEVERITY_INFO,
    };
    let pri = u16::from(FACILITY) * 8 + u16::from(severity);
    let fields = fields(e);
    let mut m = format!("<{pri}>1 {} {hostname} {APP_NAME} {procid} {} [{SD_ID}", rfc3339(e.time_ns), e.kind.name());
    // `event` is already the MSGID.
    for (k, v) in fields.iter().filter(|(k, _)| *k != "event") {
        let _ = write!(m, " {k}=\"{}\"", escape_param(v));
    }
    m.push(']');
    for (k, v) in &fields {
        let _ = write!(m, " {k}={v}");
    }
    m
}

/// RFC 5424 section 6.3.3: '"', '\' and ']' are escaped in PARAM-VALUE.
fn escape_param(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '"' | '\\' | ']') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// This host's name as RFC 5424 wants it (printable ASCII, no spaces), or "-".
pub fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = name.trim();
    if name.is_empty() || name.len() > 255 || !name.bytes().all(|b| (33..=126).contains(&b)) {
        "-".to_owned()
    } else {
        name.to_owned()
    }
}

enum Transport {
    Udp(UdpSocket),
    Unix(UnixDatagram, PathBuf),
}

/// Sends one datagram per event; never blocks.
pub struct SyslogSender {
    transport: Transport,
    unit: LogUnit,
    hostname: String,
    procid: u32,
    /// Whether the last datagram was taken by the socket.
    last_sent: bool,
    stats: SinkStats,
    lost: LossCounter,
}

impl SyslogSender {
    /// Opens the socket. A unix socket that does not exist yet is not an
    /// error: messages are counted as lost until a syslog daemon creates it.
    pub fn open(target: &SyslogTarget, unit: LogUnit, lost: LossCounter) -> io::Result<Self> {
        let transport = match target {
            SyslogTarget::Udp(addr) => {
                let local: SocketAddr = if addr.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
                let sock = UdpSocket::bind(local)?;
                sock.connect(addr)?;
                sock.set_nonblocking(true)?;
                Transport::Udp(sock)
            }
            SyslogTarget::Unix(path) => {
                let sock = UnixDatagram::unbound()?;
                sock.set_nonblocking(true)?;
                Transport::Unix(sock, path.clone())
            }
        };
        Ok(SyslogSender { transport, unit, hostname: hostname(), procid: std::process::id(), last_sent: false, stats: SinkStats::default(), lost })
    }

    pub fn write(&mut self, e: &Event) {
        if !records_event(self.unit, e) {
            return;
        }
        let msg = format(e, &self.hostname, self.procid);
        let sent = match &self.transport {
            Transport::Udp(s) => s.send(msg.as_bytes()),
            Transport::Unix(s, path) => s.send_to(msg.as_bytes(), path),
        };
        match sent {
            Ok(n) => {
                self.stats.records += 1;
                self.stats.messages += 1;
                self.stats.bytes += n as u64;
                self.last_sent = true;
            }
            Err(e) => {
                let mut n = 1;
                // UDP: an ICMP port unreachable is reported on the send
                // after the datagram that drew it, which was lost too.
                if e.kind() == io::ErrorKind::ConnectionRefused && std::mem::take(&mut self.last_sent) {
                    self.stats.records -= 1;
                    n += 1;
                }
                self.stats.lost += n;
                self.lost.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    pub fn stats(&self) -> SinkStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use natrix_engine::Proto;
    use std::time::Duration;

    fn ip(s: &str) -> u32 {
        u32::from(s.parse::<Ipv4Addr>().unwrap())
    }

    fn create() -> Event {
        Event {
            kind: EventKind::MappingCreated,
            time_ns: 1_767_225_600_175_000_000,
            proto: Proto::Udp,
            int_addr: ip("100.64.0.10"),
            int_port: 40000,
            ext_addr: ip("203.0.113.1"),
            ext_port: 40000,
            ext_port_end: 40000,
            rem_addr: 0,
            rem_port: 0,
            b4: None,
        }
    }

    #[test]
    fn targets_parse() {
        assert_eq!(SyslogTarget::parse("udp:192.0.2.10:514"), Ok(SyslogTarget::Udp("192.0.2.10:514".parse().unwrap())));
        assert_eq!(SyslogTarget::parse("udp:[2001:db8::1]:514"), Ok(SyslogTarget::Udp("[2001:db8::1]:514".parse().unwrap())));
        assert_eq!(SyslogTarget::parse("unix:/dev/log"), Ok(SyslogTarget::Unix("/dev/log".into())));
        for bad in ["192.0.2.10:514", "udp:192.0.2.10", "udp:host:514", "tcp:192.0.2.10:514", "unix:", "udp:0.0.0.0:514", "udp:192.0.2.10:0"] {
            assert!(SyslogTarget::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(SyslogTarget::parse("unix:/dev/log").unwrap().to_string(), "unix:/dev/log");
    }

    #[test]
    fn messages_follow_rfc5424() {
        let m = format(&create(), "nat1", 4242);
        assert_eq!(
            m,
            "<134>1 2026-01-01T00:00:00.175Z nat1 natrix 4242 mapping_create [natrix@32473 nat_event=\"8\" proto=\"udp\" \
             subscriber=\"100.64.0.10\" subscriber_port=\"40000\" external=\"203.0.113.1\" external_port=\"40000\"] \
             event=mapping_create nat_event=8 proto=udp subscriber=100.64.0.10 subscriber_port=40000 external=203.0.113.1 external_port=40000"
        );
        let softwire = format(&Event { int_addr: 0xc000_0002, b4: Some("2001:db8:b4::1".parse().unwrap()), ..create() }, "-", 1);
        assert!(softwire.contains("subscriber=\"192.0.0.2\" b4=\"2001:db8:b4::1\" subscriber_port=\"40000\""), "{softwire}");
        let q = format(&Event { kind: EventKind::QuotaExceeded, ext_addr: 0, ..create() }, "-", 1);
        assert!(q.starts_with("<132>1 "), "{q}");
        assert!(!q.contains("external"), "{q}");
        let b = format(&Event { kind: EventKind::BlockAllocated, ext_port: 1024, ext_port_end: 1087, ..create() }, "-", 1);
        assert!(b.contains("external_port=\"1024\" port_range_end=\"1087\"]") && !b.contains("subscriber_port"), "{b}");
        let s = format(&Event { kind: EventKind::SessionCreated, rem_addr: ip("198.51.100.20"), rem_port: 53, ..create() }, "-", 1);
        assert!(s.contains("remote=\"198.51.100.20\" remote_port=\"53\"]"), "{s}");
        assert_eq!(escape_param("a\"b]c\\"), "a\\\"b\\]c\\\\");
    }

    #[test]
    fn sends_over_udp_and_unix_and_counts_losses() {
        let collector = UdpSocket::bind("127.0.0.1:0").unwrap();
        collector.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let lost = LossCounter::default();
        let mut s = SyslogSender::open(&SyslogTarget::Udp(collector.local_addr().unwrap()), LogUnit::Mapping, lost.clone()).unwrap();
        s.write(&create());
        s.write(&Event { kind: EventKind::SessionCreated, ..create() }); // not in mapping mode
        let mut buf = [0u8; 2048];
        let n = collector.recv(&mut buf).unwrap();
        assert!(std::str::from_utf8(&buf[..n]).unwrap().starts_with("<134>1 2026-01-01T00:00:00.175Z "));
        assert_eq!((s.stats().records, s.stats().lost), (1, 0));

        let dir = std::env::temp_dir().join(format!("natrix-syslog-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("log.sock");
        let _ = std::fs::remove_file(&path);
        let mut u = SyslogSender::open(&SyslogTarget::Unix(path.clone()), LogUnit::Mapping, lost.clone()).unwrap();
        u.write(&create()); // nobody there yet
        assert_eq!(u.stats().lost, 1);
        let daemon = UnixDatagram::bind(&path).unwrap();
        daemon.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        u.write(&create());
        let n = daemon.recv(&mut buf).unwrap();
        assert!(std::str::from_utf8(&buf[..n]).unwrap().contains("[natrix@32473 "));
        assert_eq!((u.stats().records, u.stats().lost), (1, 1));
        assert_eq!(lost.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_refusing_udp_destination_counts_what_it_refused() {
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let lost = LossCounter::default();
        let mut s = SyslogSender::open(&SyslogTarget::Udp(closed), LogUnit::Mapping, lost.clone()).unwrap();
        for _ in 0..10 {
            s.write(&create());
            std::thread::sleep(Duration::from_millis(10));
        }
        let st = s.stats();
        assert_eq!(st.records + st.lost, 10, "{st:?}");
        // Only the last datagram's refusal comes after the last send.
        assert!(st.lost >= 8, "{st:?}");
        assert_eq!(lost.load(Ordering::Relaxed), st.lost);
    }
}
