//! `natrix pcp`: a small PCP client (RFC 6887) for operators and tests. It
//! asks a PCP server (natrix's inside address, UDP 5351) for a MAP or PEER
//! mapping, or for an ANNOUNCE, over a plain UDP socket, retrying as RFC
//! 6887 section 8.1.1 describes, and prints the answer. Exit status 0 on
//! SUCCESS, 1 on a PCP error result or no answer.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, Subcommand};
use natrix_wire::pcp::{self as wire, opcode, option, result};

use crate::Failure;

#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    op: Op,
}

#[derive(Subcommand)]
enum Op {
    /// Ask for an inbound mapping: outside hosts reach INTERNAL-PORT through the external address and port in the answer.
    Map(MapArgs),
    /// Ask for (or keep alive) the mapping and session towards one remote peer.
    Peer(PeerArgs),
    /// Ask the server for its epoch (an ANNOUNCE request).
    Announce(Common),
}

#[derive(ClapArgs)]
struct Common {
    /// The PCP server: natrix's inside address.
    #[arg(long)]
    server: Ipv4Addr,
    #[arg(long, default_value_t = wire::SERVER_PORT)]
    port: u16,
    /// The PCP client address to put in the request (default: this host's address towards the server).
    #[arg(long)]
    client_ip: Option<Ipv4Addr>,
    /// Local UDP port to send from (default: any).
    #[arg(long, default_value_t = 0)]
    source_port: u16,
    /// Seconds to wait for the first answer; doubled on each retry.
    #[arg(long, default_value_t = 1.0)]
    timeout: f64,
    /// Requests sent before giving up.
    #[arg(long, default_value_t = 4)]
    tries: u32,
    /// Print the answer as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(ClapArgs)]
struct MapArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    mapping: Mapping,
    /// Fail (CANNOT_PROVIDE_EXTERNAL) rather than accept another external address or port than suggested.
    #[arg(long)]
    prefer_failure: bool,
    /// Only these remote peers may use the mapping: ADDR[/LEN][:PORT] (port 0 or none: any). Repeatable.
    #[arg(long = "filter")]
    filters: Vec<String>,
}

#[derive(ClapArgs)]
struct PeerArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    mapping: Mapping,
    /// The remote peer, ADDR:PORT.
    #[arg(long)]
    remote: SocketAddrV4,
}

#[derive(ClapArgs)]
struct Mapping {
    /// udp, tcp, or an IP protocol number.
    #[arg(long, default_value = "udp")]
    protocol: String,
    #[arg(long)]
    internal_port: u16,
    /// Suggested external ADDR:PORT (0.0.0.0 or port 0: no preference).
    #[arg(long)]
    suggest: Option<SocketAddrV4>,
    /// Requested lifetime in seconds; 0 deletes the mapping (use the nonce it was made with).
    #[arg(long, default_value_t = 3600)]
    lifetime: u32,
    /// The mapping nonce, 24 hex digits (default: random). Refreshing or deleting a mapping needs the nonce that made it.
    #[arg(long)]
    nonce: Option<String>,
}

/// A decoded answer.
struct Answer {
    op: u8,
    result: u8,
    lifetime: u32,
    epoch: u32,
    map: Option<MapAnswer>,
}

/// The opcode data of a MAP or PEER answer.
#[derive(Clone, Copy)]
struct MapAnswer {
    nonce: Nonce,
    protocol: u8,
    internal_port: u16,
    ext_addr: Option<Ipv4Addr>,
    ext_port: u16,
}

type Nonce = [u8; wire::NONCE_LEN];

/// What MAP and PEER requests share: protocol, nonce, suggested external endpoint.
struct Fields {
    proto: u8,
    nonce: Nonce,
    ext: ([u8; 16], u16),
}

pub fn run(args: &Args) -> Result<(), Failure> {
    match &args.op {
        Op::Announce(c) => {
            let sock = open(c)?;
            let client = client_addr(c, &sock)?;
            let mut req = vec![0u8; wire::HEADER_LEN];
            wire::emit_request_header(&mut req, opcode::ANNOUNCE, 0, wire::v4_mapped(client.into()));
            let a = exchange(c, &sock, &req, opcode::ANNOUNCE, None)?;
            report(c, &a, client, None)
        }
        Op::Map(m) => {
            let c = &m.common;
            let sock = open(c)?;
            let client = client_addr(c, &sock)?;
            let Fields { proto, nonce, ext } = mapping_fields(&m.mapping)?;
            let mut req = vec![0u8; wire::HEADER_LEN + wire::MAP_LEN];
            wire::emit_request_header(&mut req, opcode::MAP, m.mapping.lifetime, wire::v4_mapped(client.into()));
            wire::emit_map(&mut req[wire::HEADER_LEN..], nonce, proto, m.mapping.internal_port, ext);
            if m.prefer_failure {
                push_option(&mut req, option::PREFER_FAILURE, &[]);
            }
            for f in &m.filters {
                let f = parse_filter(f)?;
                push_option(&mut req, option::FILTER, &f.emit());
            }
            let a = exchange(c, &sock, &req, opcode::MAP, Some(nonce))?;
            report(c, &a, client, None)
        }
        Op::Peer(p) => {
            let c = &p.common;
            let sock = open(c)?;
            let client = client_addr(c, &sock)?;
            let Fields { proto, nonce, ext } = mapping_fields(&p.mapping)?;
            let mut req = vec![0u8; wire::HEADER_LEN + wire::PEER_LEN];
            wire::emit_request_header(&mut req, opcode::PEER, p.mapping.lifetime, wire::v4_mapped(client.into()));
            let remote = (wire::v4_mapped((*p.remote.ip()).into()), p.remote.port());
            wire::emit_peer(&mut req[wire::HEADER_LEN..], nonce, proto, p.mapping.internal_port, ext, remote);
            let a = exchange(c, &sock, &req, opcode::PEER, Some(nonce))?;
            report(c, &a, client, Some(p.remote))
        }
    }
}

fn open(c: &Common) -> Result<UdpSocket, Failure> {
    let sock = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, c.source_port))).map_err(|e| Failure::Other(format!("cannot open a UDP socket: {e}")))?;
    sock.connect(SocketAddr::from((c.server, c.port))).map_err(|e| Failure::Other(format!("cannot reach {}:{}: {e}", c.server, c.port)))?;
    Ok(sock)
}

/// The address the server sees requests come from, unless given.
fn client_addr(c: &Common, sock: &UdpSocket) -> Result<Ipv4Addr, Failure> {
    if let Some(a) = c.client_ip {
        return Ok(a);
    }
    match sock.local_addr() {
        Ok(SocketAddr::V4(a)) => Ok(*a.ip()),
        _ => Err(Failure::Other("cannot tell this host's address towards the server; give --client-ip".into())),
    }
}

fn mapping_fields(m: &Mapping) -> Result<Fields, Failure> {
    let proto = match m.protocol.to_ascii_lowercase().as_str() {
        "udp" => 17,
        "tcp" => 6,
        "all" => 0,
        n => n.parse::<u8>().map_err(|_| Failure::Other(format!("--protocol: \"{n}\" is not udp, tcp or a protocol number")))?,
    };
    let nonce = match &m.nonce {
        Some(h) => parse_nonce(h)?,
        None => random_nonce(),
    };
    let ext = match m.suggest {
        Some(s) if !s.ip().is_unspecified() => (wire::v4_mapped((*s.ip()).into()), s.port()),
        Some(s) => ([0; 16], s.port()),
        None => ([0; 16], 0),
    };
    Ok(Fields { proto, nonce, ext })
}

fn parse_nonce(h: &str) -> Result<Nonce, Failure> {
    let bad = || Failure::Other(format!("--nonce: \"{h}\" is not 24 hex digits"));
    if h.len() != 2 * wire::NONCE_LEN || !h.is_ascii() {
        return Err(bad());
    }
    let mut n = [0u8; wire::NONCE_LEN];
    for (i, b) in n.iter_mut().enumerate() {
        *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(n)
}

fn random_nonce() -> Nonce {
    let mut n = [0u8; wire::NONCE_LEN];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if std::io::Read::read_exact(&mut f, &mut n).is_ok() {
            return n;
        }
    }
    // No /dev/urandom: time and process id, which is unique enough for a nonce.
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    n[..8].copy_from_slice(&t.to_be_bytes());
    n[8..].copy_from_slice(&std::process::id().to_be_bytes());
    n
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// ADDR[/LEN][:PORT]
fn parse_filter(t: &str) -> Result<wire::Filter, Failure> {
    let bad = |why: &str| Failure::Other(format!("--filter \"{t}\": {why} (expected ADDR[/LEN][:PORT], e.g. 198.51.100.0/24:53)"));
    let (net, port) = match t.rsplit_once(':') {
        Some((n, p)) => (n, p.parse::<u16>().map_err(|_| bad("bad port"))?),
        None => (t, 0),
    };
    let (addr, len) = match net.split_once('/') {
        Some((a, l)) => (a, l.parse::<u8>().ok().filter(|&l| l <= 32).ok_or_else(|| bad("prefix length must be 0-32"))?),
        None => (net, 32),
    };
    let addr: Ipv4Addr = addr.parse().map_err(|_| bad("not an IPv4 address"))?;
    Ok(wire::Filter { prefix_len: if len == 0 { 0 } else { 96 + len }, remote_port: port, remote_addr: wire::v4_mapped(addr.into()) })
}

fn push_option(req: &mut Vec<u8>, code: u8, data: &[u8]) {
    let at = req.len();
    req.resize(at + option::HEADER_LEN + data.len().div_ceil(4) * 4, 0);
    wire::emit_option(&mut req[at..], code, data);
}

/// Sends the request until an answer to it arrives (same opcode and, for
/// MAP and PEER, the same nonce), waiting `timeout` and then twice as long
/// each time.
fn exchange(c: &Common, sock: &UdpSocket, req: &[u8], op: u8, nonce: Option<Nonce>) -> Result<Answer, Failure> {
    let mut wait = Duration::from_secs_f64(c.timeout.max(0.01));
    let mut buf = [0u8; 2048];
    for _ in 0..c.tries.max(1) {
        sock.send(req).map_err(|e| Failure::Other(format!("sending to {}:{}: {e}", c.server, c.port)))?;
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            sock.set_read_timeout(Some(left)).map_err(|e| Failure::Other(e.to_string()))?;
            let n = match sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
                // An ICMP error (port unreachable) for an earlier try: keep waiting.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(Failure::Other(format!("receiving from {}:{}: {e}", c.server, c.port))),
            };
            if let Some(a) = decode(&buf[..n], op, nonce) {
                return Ok(a);
            }
        }
        wait = wait.saturating_mul(2);
    }
    Err(Failure::Other(format!("no answer from the PCP server at {}:{} after {} tries", c.server, c.port, c.tries.max(1))))
}

fn decode(b: &[u8], op: u8, nonce: Option<Nonce>) -> Option<Answer> {
    let r = wire::Response::new_checked(b).ok()?;
    if r.opcode() != op {
        return None;
    }
    let mut a = Answer { op, result: r.result(), lifetime: r.lifetime(), epoch: r.epoch(), map: None };
    if op == opcode::MAP || op == opcode::PEER {
        if let Ok(m) = wire::Map::new_checked(r.body()) {
            if nonce.is_some_and(|n| n != m.nonce()) {
                return None;
            }
            let ext_addr = wire::v4_of(&m.external_addr()).map(Ipv4Addr::from);
            a.map = Some(MapAnswer { nonce: m.nonce(), protocol: m.protocol(), internal_port: m.internal_port(), ext_addr, ext_port: m.external_port() });
        }
    }
    Some(a)
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        0 => "all".into(),
        n => n.to_string(),
    }
}

fn report(c: &Common, a: &Answer, client: Ipv4Addr, remote: Option<SocketAddrV4>) -> Result<(), Failure> {
    let name = result::name(a.result);
    let ext = a.map.map(|m| format!("{}:{}", m.ext_addr.unwrap_or(Ipv4Addr::UNSPECIFIED), m.ext_port));
    if c.json {
        let mut v = serde_json::json!({
            "server": format!("{}:{}", c.server, c.port),
            "opcode": opcode::name(a.op),
            "result": name,
            "result_code": a.result,
            "lifetime": a.lifetime,
            "epoch": a.epoch,
        });
        if let Some(m) = a.map {
            v["protocol"] = proto_name(m.protocol).into();
            v["internal"] = format!("{client}:{}", m.internal_port).into();
            v["internal_port"] = m.internal_port.into();
            v["external"] = ext.clone().unwrap_or_default().into();
            v["external_address"] = m.ext_addr.map(|a| a.to_string()).into();
            v["external_port"] = m.ext_port.into();
            v["nonce"] = hex(&m.nonce).into();
        }
        if let Some(r) = remote {
            v["remote"] = r.to_string().into();
        }
        println!("{v}");
    } else {
        println!("result    {name} ({})", a.result);
        if let Some(m) = a.map {
            println!("internal  {client}:{} ({})", m.internal_port, proto_name(m.protocol));
            println!("external  {}", ext.unwrap_or_default());
            if let Some(r) = remote {
                println!("remote    {r}");
            }
            println!("nonce     {}", hex(&m.nonce));
        }
        println!("lifetime  {}", a.lifetime);
        println!("epoch     {}", a.epoch);
    }
    if a.result == result::SUCCESS {
        Ok(())
    } else {
        Err(Failure::Other(format!("the PCP server at {} answered {name}", c.server)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_nonces_parse() {
        let f = parse_filter("198.51.100.0/24:53").unwrap();
        assert_eq!((f.prefix_len, f.remote_port, wire::v4_of(&f.remote_addr)), (120, 53, Some(0xc633_6400)));
        assert_eq!(parse_filter("198.51.100.13").unwrap().prefix_len, 128);
        assert_eq!(parse_filter("0.0.0.0/0").unwrap().prefix_len, 0);
        assert!(parse_filter("198.51.100.0/33").is_err());
        assert!(parse_filter("host:53").is_err());
        assert_eq!(parse_nonce("000102030405060708090a0b").unwrap(), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        assert!(parse_nonce("00").is_err());
        assert!(parse_nonce("zz0102030405060708090a0b").is_err());
    }

    #[test]
    fn answers_to_other_requests_are_ignored() {
        let mut b = vec![0u8; wire::HEADER_LEN + wire::MAP_LEN];
        wire::emit_response_header(&mut b, 2, opcode::MAP, result::SUCCESS, 60, 5);
        wire::emit_map(&mut b[wire::HEADER_LEN..], [1; 12], 17, 5000, (wire::v4_mapped(0xcb00_7101), 5000));
        let a = decode(&b, opcode::MAP, Some([1; 12])).unwrap();
        assert_eq!(a.map.unwrap().ext_addr, Some(Ipv4Addr::new(203, 0, 113, 1)));
        assert!(decode(&b, opcode::MAP, Some([2; 12])).is_none());
        assert!(decode(&b, opcode::PEER, None).is_none());
    }
}
