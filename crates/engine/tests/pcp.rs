//! The PCP server (RFC 6887) through `Engine::process`. Requests are packed
//! here byte by byte from the RFC's figures (never with natrix_wire) and the
//! answers decoded with etherparse, checksums included.

mod common;

use common::*;
use natrix_engine::config::{Filtering, PortSelection};
use natrix_engine::pcp::PcpConfig;
use natrix_engine::trackers::{tcp, TimeoutClass};
use natrix_engine::{DropReason, Engine, EngineConfig, EventKind, Side, Verdict};

const SUB: [u8; 4] = [100, 64, 0, 10];
const SUB2: [u8; 4] = [100, 64, 0, 11];
const PEER: [u8; 4] = [198, 51, 100, 13];
const OTHER: [u8; 4] = [198, 51, 100, 12];
const POOL1: [u8; 4] = [203, 0, 113, 1];
const NONCE: [u8; 12] = *b"natrix-nonce";
const CPORT: u16 = 40123;

const SUCCESS: u8 = 0;
const UNSUPP_VERSION: u8 = 1;
const NOT_AUTHORIZED: u8 = 2;
const MALFORMED_REQUEST: u8 = 3;
const UNSUPP_OPCODE: u8 = 4;
const UNSUPP_OPTION: u8 = 5;
const MALFORMED_OPTION: u8 = 6;
const UNSUPP_PROTOCOL: u8 = 9;
const USER_EX_QUOTA: u8 = 10;
const CANNOT_PROVIDE_EXTERNAL: u8 = 11;
const ADDRESS_MISMATCH: u8 = 12;

fn pcp_config() -> EngineConfig {
    EngineConfig { pcp: Some(PcpConfig { max_lifetime_s: 7200 }), ..config_single(POOL1) }
}

fn mapped(a: [u8; 4]) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[10] = 0xff;
    m[11] = 0xff;
    m[12..].copy_from_slice(&a);
    m
}

/// RFC 6887 figure 2: version, R|opcode, reserved, lifetime, client address.
fn header(version: u8, op: u8, lifetime: u32, client: [u8; 4]) -> Vec<u8> {
    let mut v = vec![version, op, 0, 0];
    v.extend_from_slice(&lifetime.to_be_bytes());
    v.extend_from_slice(&mapped(client));
    v
}

/// Figure 9: MAP opcode data.
fn map_data(nonce: [u8; 12], protocol: u8, iport: u16, sport: u16, saddr: [u8; 16]) -> Vec<u8> {
    let mut v = nonce.to_vec();
    v.extend_from_slice(&[protocol, 0, 0, 0]);
    v.extend_from_slice(&iport.to_be_bytes());
    v.extend_from_slice(&sport.to_be_bytes());
    v.extend_from_slice(&saddr);
    v
}

fn option(code: u8, data: &[u8]) -> Vec<u8> {
    let mut v = vec![code, 0];
    v.extend_from_slice(&(data.len() as u16).to_be_bytes());
    v.extend_from_slice(data);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

/// Figure 15: FILTER, with an IPv4 prefix length (96 is added).
fn filter(addr: [u8; 4], v4_prefix: u8, port: u16) -> Vec<u8> {
    let mut d = vec![0, 96 + v4_prefix];
    d.extend_from_slice(&port.to_be_bytes());
    d.extend_from_slice(&mapped(addr));
    option(3, &d)
}

fn map_req(client: [u8; 4], lifetime: u32, nonce: [u8; 12], protocol: u8, iport: u16, suggest: (u16, [u8; 4]), opts: &[Vec<u8>]) -> Vec<u8> {
    let mut v = header(2, 1, lifetime, client);
    v.extend(map_data(nonce, protocol, iport, suggest.0, if suggest.1 == [0; 4] { [0; 16] } else { mapped(suggest.1) }));
    for o in opts {
        v.extend_from_slice(o);
    }
    v
}

/// Figure 10: PEER opcode data.
fn peer_req(client: [u8; 4], lifetime: u32, nonce: [u8; 12], protocol: u8, iport: u16, remote: ([u8; 4], u16)) -> Vec<u8> {
    let mut v = header(2, 2, lifetime, client);
    v.extend(map_data(nonce, protocol, iport, 0, [0; 16]));
    v.extend_from_slice(&remote.1.to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&mapped(remote.0));
    v
}

#[derive(Debug)]
struct Answer {
    version: u8,
    opcode: u8,
    result: u8,
    lifetime: u32,
    epoch: u32,
    body: Vec<u8>,
}

impl Answer {
    fn ext(&self) -> ([u8; 4], u16) {
        assert_eq!(&self.body[20..32], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff], "external address is IPv4-mapped");
        ([self.body[32], self.body[33], self.body[34], self.body[35]], u16::from_be_bytes([self.body[18], self.body[19]]))
    }
}

/// Sends `msg` from `src` to the PCP server; returns the verdict and the
/// one answer (None if there was none), checked as a frame.
fn ask(e: &mut Engine, src: [u8; 4], msg: &[u8], now: u64) -> (Verdict, Option<Answer>) {
    let mut f = udp_frame(Side::Inside, src, CPORT, INSIDE_ADDR, 5351, 64, msg, false);
    let v = run(e, &mut f, Side::Inside, now);
    let out = outputs(e);
    assert!(out.len() <= 1, "one answer at most: {out:02x?}");
    let Some((side, t, bytes)) = out.into_iter().next() else { return (v, None) };
    assert_eq!((side, t), (Side::Inside, now));
    let d = must_decode(&bytes);
    assert_eq!((d.eth.source, d.eth.destination), (MAC_NAT_IN, MAC_SUB), "Ethernet addresses swapped");
    assert_eq!((d.src(), d.dst()), (INSIDE_ADDR, src));
    let u = d.udp();
    assert_eq!((u.source_port, u.destination_port), (5351, CPORT));
    assert_ne!(u.checksum, 0, "PCP answers carry a UDP checksum");
    let p = &d.payload;
    assert!(p.len() >= 24 && p.len() <= 1100 && p.len().is_multiple_of(4), "answer length {}", p.len());
    // RFC 6887 section 7.2: zeros, but for a request that did not parse
    // the last 96 bits of its client address field.
    let mut reserved = [0u8; 12];
    if matches!(p[3], UNSUPP_VERSION | MALFORMED_REQUEST | UNSUPP_OPCODE | MALFORMED_OPTION) {
        msg.iter().skip(12).take(12).enumerate().for_each(|(i, &b)| reserved[i] = b);
    }
    assert_eq!(&p[12..24], &reserved, "reserved");
    assert_eq!(p[2], 0, "reserved");
    assert!(p[1] & 0x80 != 0, "R bit");
    let a = Answer {
        version: p[0],
        opcode: p[1] & 0x7f,
        result: p[3],
        lifetime: u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
        epoch: u32::from_be_bytes([p[8], p[9], p[10], p[11]]),
        body: p[24..].to_vec(),
    };
    (v, Some(a))
}

fn answer(e: &mut Engine, src: [u8; 4], msg: &[u8], now: u64) -> Answer {
    let (v, a) = ask(e, src, msg, now);
    assert_eq!(v, Verdict::Drop(DropReason::LocalDestination), "the request itself ends at natrix");
    a.expect("an answer")
}

fn events(e: &mut Engine) -> Vec<natrix_engine::Event> {
    let mut v = Vec::new();
    e.drain_events(|ev| v.push(ev));
    v
}

fn inbound(e: &mut Engine, from: [u8; 4], sport: u16, ext: ([u8; 4], u16), now: u64) -> (Verdict, Vec<u8>) {
    let mut f = udp_frame(Side::Outside, from, sport, ext.0, ext.1, 64, b"hello", false);
    let v = run(e, &mut f, Side::Outside, now);
    (v, f)
}

/// RFC 6887 section 18.1: one client flooding the server takes at most its
/// share of the answers in a second; the others are still answered.
#[test]
fn one_clients_flood_leaves_the_others_their_answers() {
    let mut e = engine(pcp_config());
    let mut answered = 0;
    for i in 0..150u64 {
        let (_, a) = ask(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), SEC + i * 1_000_000);
        answered += u32::from(a.is_some());
    }
    assert_eq!(answered, 100, "one client's share of a second");
    assert_eq!(answer(&mut e, SUB2, &map_req(SUB2, 3600, NONCE, 17, 6000, (0, [0; 4]), &[]), SEC + 200_000_000).result, SUCCESS, "another client is answered");
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), 2 * SEC).result, SUCCESS, "the next second, the first again");
}

#[test]
fn map_round_trip_then_an_outside_host_reaches_the_subscriber() {
    let mut e = engine(pcp_config());
    let a = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), SEC);
    assert_eq!((a.version, a.opcode, a.result, a.lifetime), (2, 1, SUCCESS, 3600));
    assert_eq!(&a.body[..12], &NONCE, "nonce echoed");
    assert_eq!((a.body[12], u16::from_be_bytes([a.body[16], a.body[17]])), (17, 5000));
    let ext = a.ext();
    assert_eq!(ext, (POOL1, 5000), "port preserved");
    let ev = events(&mut e);
    assert!(ev.iter().any(|x| x.kind == EventKind::MappingCreated && x.int_port == 5000 && x.ext_port == 5000), "logged like any mapping: {ev:?}");
    let views = e.mapping_views(None);
    assert_eq!(views.len(), 1, "shown like any mapping");
    assert_eq!((views[0].int_addr, views[0].ext_port), (u32_of(SUB), 5000));
    let (v, f) = inbound(&mut e, PEER, 9999, ext, 2 * SEC);
    assert_eq!(v, Verdict::Forward(Side::Inside));
    let d = must_decode(&f);
    assert_eq!((d.dst(), d.udp().destination_port, d.src()), (SUB, 5000, PEER));
}

/// A MAP for an implicit mapping that remotes have filled to
/// `max_sessions_per_mapping` (RFC 6888 REQ-5) would add its hold as one
/// session more: refused as a quota (RFC 6887 USER_EX_QUOTA); with room,
/// the hold counts as one of the mapping's sessions.
#[test]
fn a_map_for_a_mapping_at_its_session_limit_is_refused_as_a_quota() {
    let mut e = engine(EngineConfig { max_sessions_per_mapping: 2, ..pcp_config() });
    let mut f = udp_frame(Side::Inside, SUB, 5000, PEER, 53, 64, b"q", false);
    assert_eq!(run(&mut e, &mut f, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let ext = (POOL1, must_decode(&f).udp().source_port);
    assert_eq!(inbound(&mut e, OTHER, 7000, ext, SEC).0, Verdict::Forward(Side::Inside), "the second session");
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), 2 * SEC).result, USER_EX_QUOTA);
    let mut f = udp_frame(Side::Inside, SUB, 6000, PEER, 53, 64, b"q", false);
    assert_eq!(run(&mut e, &mut f, Side::Inside, 3 * SEC), Verdict::Forward(Side::Outside));
    let ext = (POOL1, must_decode(&f).udp().source_port);
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 6000, (0, [0; 4]), &[]), 3 * SEC).result, SUCCESS, "room for the hold");
    assert_eq!(inbound(&mut e, OTHER, 7000, ext, 4 * SEC).0, Verdict::Drop(DropReason::MappingSessionQuota), "the hold is one of two");
}

#[test]
fn the_mapping_outlives_its_idle_timeout_and_ends_with_its_lifetime() {
    let mut e = engine(pcp_config());
    let ext = answer(&mut e, SUB, &map_req(SUB, 1000, NONCE, 17, 5000, (0, [0; 4]), &[]), SEC).ext();
    events(&mut e);
    // 900 s without a packet: three UDP timeouts.
    e.advance(900 * SEC);
    assert_eq!(e.mapping_views(None).len(), 1);
    assert_eq!(inbound(&mut e, PEER, 9999, ext, 901 * SEC).0, Verdict::Forward(Side::Inside));
    // The lifetime ends at 1001 s; the traffic session keeps the mapping
    // until it idles out too (5 min after 901 s).
    e.advance(1002 * SEC);
    assert!(e.pcp_holds().is_empty());
    assert_eq!(e.mapping_views(None).len(), 1);
    assert!(events(&mut e).iter().all(|x| x.kind != EventKind::MappingDeleted));
    e.advance(1300 * SEC);
    let ev = events(&mut e);
    assert!(ev.iter().any(|x| x.kind == EventKind::MappingDeleted && x.ext_port == 5000), "{ev:?}");
    assert!(e.mapping_views(None).is_empty());
    assert_eq!(inbound(&mut e, PEER, 9998, ext, 1301 * SEC).0, Verdict::Drop(DropReason::NoMapping));
    // Without traffic, the mapping goes when the lifetime ends.
    let ext = answer(&mut e, SUB, &map_req(SUB, 500, NONCE, 17, 5000, (0, [0; 4]), &[]), 1400 * SEC).ext();
    assert_ne!(ext.1, 5000, "5000 is in hold-down");
    events(&mut e);
    e.advance(1899 * SEC);
    assert_eq!(e.mapping_views(None).len(), 1);
    e.advance(1901 * SEC);
    assert!(events(&mut e).iter().any(|x| x.kind == EventKind::MappingDeleted && x.ext_port == ext.1));
    assert!(e.mapping_views(None).is_empty());
}

#[test]
fn lifetime_is_capped_and_a_refresh_with_the_same_nonce_keeps_the_port() {
    let mut e = engine(pcp_config());
    let a = answer(&mut e, SUB, &map_req(SUB, 1_000_000, NONCE, 6, 8080, (0, [0; 4]), &[]), SEC);
    assert_eq!((a.result, a.lifetime), (SUCCESS, 7200));
    let a2 = answer(&mut e, SUB, &map_req(SUB, 60, NONCE, 6, 8080, (0, [0; 4]), &[]), 100 * SEC);
    assert_eq!((a2.result, a2.ext()), (SUCCESS, a.ext()));
    assert_eq!(a2.lifetime, 120, "short requests get the 2-minute minimum");
    let bad = answer(&mut e, SUB, &map_req(SUB, 60, *b"someone-else", 6, 8080, (0, [0; 4]), &[]), 101 * SEC);
    assert_eq!((bad.result, bad.lifetime), (NOT_AUTHORIZED, 1800));
    assert_eq!(&bad.body[..12], b"someone-else", "error answers copy the request");
    // Delete: lifetime 0 with the right nonce.
    let del = answer(&mut e, SUB, &map_req(SUB, 0, NONCE, 6, 8080, (0, [0; 4]), &[]), 102 * SEC);
    assert_eq!((del.result, del.lifetime), (SUCCESS, 0));
    assert!(e.mapping_views(None).is_empty());
    let ev = events(&mut e);
    assert!(ev.iter().any(|x| x.kind == EventKind::MappingDeleted && x.int_port == 8080));
    // Internal port 0, lifetime 0: every mapping of the client for the
    // protocol (protocol 0: every protocol) that this nonce made.
    for port in [1000, 1001] {
        answer(&mut e, SUB, &map_req(SUB, 600, NONCE, 17, port, (0, [0; 4]), &[]), 103 * SEC);
    }
    answer(&mut e, SUB, &map_req(SUB, 600, NONCE, 6, 1002, (0, [0; 4]), &[]), 103 * SEC);
    answer(&mut e, SUB, &map_req(SUB, 600, *b"other-nonce!", 17, 1003, (0, [0; 4]), &[]), 103 * SEC);
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 0, NONCE, 17, 0, (0, [0; 4]), &[]), 104 * SEC).result, SUCCESS);
    let mut left: Vec<u16> = e.mapping_views(None).iter().map(|m| m.int_port).collect();
    left.sort_unstable();
    assert_eq!(left, vec![1002, 1003]);
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 0, NONCE, 0, 0, (0, [0; 4]), &[]), 105 * SEC).result, SUCCESS);
    assert_eq!(e.mapping_views(None).iter().map(|m| m.int_port).collect::<Vec<_>>(), vec![1003]);
}

#[test]
fn an_inbound_syn_reaches_a_tcp_mapping() {
    let mut e = engine(pcp_config());
    let ext = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 6, 22, (0, [0; 4]), &[]), SEC).ext();
    let mut syn = tcp_frame(Side::Outside, PEER, 50000, ext.0, ext.1, 64, TcpKind::Syn, 1, 0, b"");
    assert_eq!(run(&mut e, &mut syn, Side::Outside, 2 * SEC), Verdict::Forward(Side::Inside));
    assert_eq!(must_decode(&syn).tcp().destination_port, 22);
}

/// The established path skips the TCP tracker for segments without SYN,
/// FIN or RST, which is right only if every TCP session's timeout class is
/// the one its tracker state gives: a MAP hold's keep-alive session too.
#[test]
fn a_tcp_hold_is_classed_as_its_tracker_state_says() {
    let mut e = engine(pcp_config());
    answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 6, 22, (0, [0; 4]), &[]), SEC);
    let t = e.tables();
    let held: Vec<_> = t.live_sessions().map(|id| t.session(id)).collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].class, TimeoutClass::TcpEstablished, "a hold keeps the long timeout");
    assert_eq!(held[0].class, tcp::timeout_class(held[0].state));
}

#[test]
fn suggested_external_port_is_honoured_when_free() {
    for selection in [PortSelection::Preserve, PortSelection::Random] {
        let mut e = engine(EngineConfig { port_selection: selection, ..pcp_config() });
        let a = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (40000, POOL1), &[]), SEC);
        assert_eq!((a.result, a.ext()), (SUCCESS, (POOL1, 40000)), "{selection:?}");
        let ev = events(&mut e);
        let created: Vec<_> = ev.iter().filter(|x| x.kind == EventKind::MappingCreated).collect();
        assert_eq!(created.len(), 1);
        assert_eq!((created[0].int_port, created[0].ext_port), (5000, 40000), "logged with the real internal port");
        // Outbound traffic from the internal port uses the PCP mapping.
        let mut f = udp_frame(Side::Inside, SUB, 5000, PEER, 53, 64, b"q", false);
        assert_eq!(run(&mut e, &mut f, Side::Inside, 2 * SEC), Verdict::Forward(Side::Outside));
        assert_eq!(must_decode(&f).udp().source_port, 40000);
    }
}

/// RFC 6887 section 11.3: a suggested external port that is free is
/// given, the internal port included, whatever the port selection policy.
#[test]
fn a_suggested_port_equal_to_the_internal_port_is_given_under_random_selection() {
    let mut e = engine(EngineConfig { port_selection: natrix_engine::config::PortSelection::Random, ..pcp_config() });
    for port in [5000u16, 5002, 5004] {
        let a = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, port, (port, [0; 4]), &[]), SEC);
        assert_eq!((a.result, a.ext().1), (SUCCESS, port));
    }
}

#[test]
fn prefer_failure_refuses_a_taken_port_and_leaves_no_trace() {
    let mut e = engine(pcp_config());
    assert_eq!(answer(&mut e, SUB2, &map_req(SUB2, 3600, NONCE, 17, 40000, (0, [0; 4]), &[]), SEC).ext(), (POOL1, 40000));
    events(&mut e);
    let pf = option(2, &[]);
    let a = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (40000, POOL1), std::slice::from_ref(&pf)), 2 * SEC);
    assert_eq!((a.result, a.lifetime), (CANNOT_PROVIDE_EXTERNAL, 1800));
    assert!(events(&mut e).is_empty(), "a failed request changes nothing");
    assert_eq!(e.mapping_views(Some(u32_of(SUB))).len(), 0);
    assert_eq!(e.subscribers().len(), 1, "the failed subscriber holds nothing");
    // Without PREFER_FAILURE another port is assigned.
    let b = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (40000, POOL1), &[]), 3 * SEC);
    assert_eq!(b.result, SUCCESS);
    assert_ne!(b.ext().1, 40000);
    // PREFER_FAILURE is echoed on success.
    let c = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 6000, (6000, [0; 4]), std::slice::from_ref(&pf)), 4 * SEC);
    assert_eq!((c.result, c.ext().1), (SUCCESS, 6000));
    assert_eq!(&c.body[36..], &pf[..]);
    // PREFER_FAILURE with nothing suggested is malformed.
    let d = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 7000, (0, [0; 4]), &[pf]), 5 * SEC);
    assert_eq!(d.result, MALFORMED_OPTION);
}

#[test]
fn filter_option_restricts_remote_peers() {
    for filtering in [Filtering::EndpointIndependent, Filtering::AddressAndPortDependent] {
        let mut e = engine(EngineConfig { filtering, ..pcp_config() });
        let f = filter(PEER, 32, 0);
        let a = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), std::slice::from_ref(&f)), SEC);
        assert_eq!(a.result, SUCCESS);
        assert_eq!(&a.body[36..], &f[..], "FILTER echoed");
        assert_eq!(inbound(&mut e, PEER, 1234, a.ext(), 2 * SEC).0, Verdict::Forward(Side::Inside), "{filtering:?}");
        assert_eq!(inbound(&mut e, OTHER, 1234, a.ext(), 2 * SEC).0, Verdict::Drop(DropReason::Filtered));
        // Without FILTER, a MAP mapping is endpoint-independent whatever the NAT's filtering.
        let b = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 6000, (0, [0; 4]), &[]), 3 * SEC);
        assert_eq!(inbound(&mut e, OTHER, 1234, b.ext(), 4 * SEC).0, Verdict::Forward(Side::Inside), "{filtering:?}");
        // A refresh replaces the filters.
        answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), 5 * SEC);
        assert_eq!(inbound(&mut e, OTHER, 1235, a.ext(), 6 * SEC).0, Verdict::Forward(Side::Inside));
    }
}

#[test]
fn peer_keeps_a_session_alive_for_its_lifetime() {
    let mut e = engine(EngineConfig { filtering: Filtering::AddressAndPortDependent, ..pcp_config() });
    let a = answer(&mut e, SUB, &peer_req(SUB, 1000, NONCE, 17, 6000, (PEER, 7000)), SEC);
    assert_eq!((a.opcode, a.result, a.lifetime), (2, SUCCESS, 1000));
    assert_eq!(a.body.len(), 56);
    assert_eq!(u16::from_be_bytes([a.body[36], a.body[37]]), 7000, "remote port echoed");
    assert_eq!(&a.body[40..56], &mapped(PEER));
    let ext = a.ext();
    e.advance(800 * SEC);
    assert_eq!(inbound(&mut e, PEER, 7000, ext, 801 * SEC).0, Verdict::Forward(Side::Inside));
    assert_eq!(inbound(&mut e, PEER, 7001, ext, 801 * SEC).0, Verdict::Drop(DropReason::Filtered));
    // After the lifetime, the session idles out like any other (5 min for UDP).
    e.advance(1002 * SEC + 301 * SEC);
    assert!(e.session_views(None).is_empty());
    assert!(e.pcp_holds().is_empty());
}

#[test]
fn map_takes_over_a_mapping_traffic_made() {
    let mut e = engine(pcp_config());
    let mut f = udp_frame(Side::Inside, SUB, 5000, PEER, 53, 64, b"q", false);
    assert_eq!(run(&mut e, &mut f, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let eport = must_decode(&f).udp().source_port;
    let a = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), 2 * SEC);
    assert_eq!(a.ext(), (POOL1, eport));
    e.advance(1000 * SEC);
    assert_eq!(e.mapping_views(None).len(), 1, "the traffic session went, the PCP hold stays");
}

#[test]
fn quotas_apply_to_pcp_mappings() {
    let mut e = engine(EngineConfig { max_ports_per_subscriber: 1, ..pcp_config() });
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), SEC).result, SUCCESS);
    let a = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5001, (0, [0; 4]), &[]), SEC);
    assert_eq!((a.result, a.lifetime), (USER_EX_QUOTA, 30));
    let ev = events(&mut e);
    assert!(ev.iter().any(|x| x.kind == EventKind::QuotaExceeded), "quota events are logged: {ev:?}");
    // A subscriber's traffic sees the same quota.
    let mut f = udp_frame(Side::Inside, SUB, 5002, PEER, 53, 64, b"q", false);
    assert_eq!(run(&mut e, &mut f, Side::Inside, 2 * SEC), Verdict::Drop(DropReason::PortQuota));
}

#[test]
fn error_codes() {
    let mut e = engine(pcp_config());
    let map = map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]);
    // Unsupported version: answered with version 2.
    let mut v1 = map.clone();
    v1[0] = 1;
    let a = answer(&mut e, SUB, &v1, SEC);
    assert_eq!((a.version, a.result), (2, UNSUPP_VERSION));
    let mut v0 = vec![0u8, 0];
    v0.extend_from_slice(&[0; 10]);
    assert_eq!(answer(&mut e, SUB, &v0, SEC).result, UNSUPP_VERSION);
    // Too short for the opcode, or not a multiple of 4.
    assert_eq!(answer(&mut e, SUB, &map[..24 + 20], SEC).result, MALFORMED_REQUEST);
    let mut odd = map.clone();
    odd.push(0);
    let a = answer(&mut e, SUB, &odd, SEC);
    assert_eq!(a.result, MALFORMED_REQUEST);
    let mut long = map.clone();
    long.resize(1200, 0);
    let a = answer(&mut e, SUB, &long, SEC);
    assert_eq!((a.result, a.body.len() + 24), (MALFORMED_REQUEST, 1100), "truncated to 1100 octets");
    // Unknown opcode.
    let mut op = map.clone();
    op[1] = 5;
    let a = answer(&mut e, SUB, &op, SEC);
    assert_eq!((a.opcode, a.result), (5, UNSUPP_OPCODE));
    // Client address field is not the source.
    let a = answer(&mut e, SUB, &map_req(SUB2, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), SEC);
    assert_eq!(a.result, ADDRESS_MISMATCH);
    // Options.
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[option(99, &[1])]), SEC).result, UNSUPP_OPTION);
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[option(1, &mapped(SUB2))]), SEC).result, UNSUPP_OPTION, "THIRD_PARTY");
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[option(3, &[0; 8])]), SEC).result, MALFORMED_OPTION);
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[option(200, &[1, 2, 3])]), SEC).result, SUCCESS, "optional options are ignored");
    // Protocols.
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 132, 5000, (0, [0; 4]), &[]), SEC).result, UNSUPP_PROTOCOL);
    // "All ports" is legal (section 11.1), and refused by policy.
    assert_eq!(answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 0, (0, [0; 4]), &[]), SEC).result, NOT_AUTHORIZED);
    assert_eq!(answer(&mut e, SUB, &peer_req(SUB, 3600, NONCE, 17, 5000, ([0; 4], 7000)), SEC).result, MALFORMED_REQUEST);
    // Silently dropped: a response, shorter than 24 octets, under 2 octets.
    let mut resp = map.clone();
    resp[1] |= 0x80;
    for m in [&resp[..], &map[..20], &map[..1]] {
        let (v, a) = ask(&mut e, SUB, m, SEC);
        assert_eq!(v, Verdict::Drop(DropReason::LocalDestination));
        assert!(a.is_none());
    }
    let st = e.pcp_stats();
    assert_eq!(st.ignored, 3);
    assert_eq!(st.results[usize::from(UNSUPP_VERSION)], 2);
}

#[test]
fn announce_and_epoch() {
    let mut e = engine(pcp_config());
    let a = answer(&mut e, SUB, &header(2, 0, 0, SUB), 10 * SEC);
    assert_eq!((a.opcode, a.result, a.lifetime, a.epoch), (0, SUCCESS, 0, 0));
    assert!(a.body.is_empty());
    let b = answer(&mut e, SUB, &header(2, 0, 0, SUB), 75 * SEC);
    assert_eq!(b.epoch, 65, "seconds since the server's state began");
    // The unsolicited ANNOUNCE a restarted server multicasts.
    let f = e.pcp_announcement([2, 0, 0, 0, 0, 0xfe]).expect("pcp enabled");
    let d = must_decode(&f);
    assert_eq!(d.eth.destination, [1, 0, 0x5e, 0, 0, 1]);
    assert_eq!((d.src(), d.dst(), d.udp().source_port, d.udp().destination_port), (INSIDE_ADDR, [224, 0, 0, 1], 5351, 5350));
    assert_eq!(&d.payload[..4], &[2, 0x80, 0, 0]);
}

#[test]
fn disabled_server_is_silent() {
    let mut e = engine(config_single(POOL1));
    let (v, a) = ask(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), SEC);
    assert_eq!(v, Verdict::Drop(DropReason::LocalDestination));
    assert!(a.is_none());
    assert!(e.pcp_announcement([2; 6]).is_none());
}

#[test]
fn clear_removes_pcp_mappings_and_a_new_request_starts_afresh() {
    let mut e = engine(pcp_config());
    answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), SEC);
    e.advance(10 * SEC);
    let c = e.clear_subscriber(u32_of(SUB), |_| {});
    assert_eq!(c.mappings, 1);
    assert!(e.pcp_holds().is_empty());
    // Another nonce is fine now: the old hold is gone.
    let a = answer(&mut e, SUB, &map_req(SUB, 3600, *b"second-nonce", 17, 5000, (0, [0; 4]), &[]), 12 * SEC);
    assert_eq!(a.result, SUCCESS);
    assert_eq!(a.epoch, 2, "RFC 6887 section 8.5: a server that lost mappings starts its epoch again (at the clear)");
    assert_eq!(e.pcp_holds().len(), 1);
}

#[test]
fn pcp_turned_off_by_a_reload_releases_what_it_held() {
    let mut e = engine(pcp_config());
    answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), SEC);
    assert_eq!(e.pcp_holds().len(), 1);
    let off = EngineConfig { pcp: None, ..e.config().clone() };
    e.reconfigure(off, |_| {}).expect("PCP turns off live");
    e.advance(3 * SEC);
    assert!(e.pcp_holds().is_empty());
    // The mapping is an ordinary one again: it idles out with its session.
    e.advance(3 * SEC + 400 * SEC);
    assert!(e.mapping_views(None).is_empty(), "released to the UDP timeout");
    // Turned on again, a new epoch: what the server held is gone.
    e.reconfigure(pcp_config(), |_| {}).expect("PCP turns on live");
    let a = answer(&mut e, SUB, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), 410 * SEC);
    assert_eq!((a.result, a.epoch), (SUCCESS, 0), "RFC 6887 section 8.5");
}

#[test]
fn frames_with_a_bad_udp_checksum_are_ignored() {
    let mut e = engine(pcp_config());
    let mut f = udp_frame(Side::Inside, SUB, CPORT, INSIDE_ADDR, 5351, 64, &map_req(SUB, 3600, NONCE, 17, 5000, (0, [0; 4]), &[]), false);
    let n = f.len();
    f[n - 1] ^= 0xff;
    run(&mut e, &mut f, Side::Inside, SEC);
    assert!(outputs(&mut e).is_empty());
    assert!(e.mapping_views(None).is_empty());
}

proptest::proptest! {
    /// Garbage to port 5351 never panics, and whatever is answered is a
    /// well-formed PCP response.
    #[test]
    fn garbage_is_answered_well_or_not_at_all(
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..160),
        version in 0u8..4, op in 0u8..4, proto in proptest::sample::select(vec![0u8, 6, 17, 1]),
        lifetime in proptest::prelude::any::<u32>(), mapped_client in proptest::prelude::any::<bool>(),
    ) {
        let mut e = engine(pcp_config());
        let mut msg = header(version, op, lifetime, if mapped_client { SUB } else { SUB2 });
        msg.extend_from_slice(&body);
        if msg.len() > 36 { msg[36] = proto; }
        let (v, a) = ask(&mut e, SUB, &msg, SEC);
        proptest::prop_assert_eq!(v, Verdict::Drop(DropReason::LocalDestination));
        if let Some(a) = a {
            proptest::prop_assert_eq!(a.version, 2);
            proptest::prop_assert_eq!(a.opcode, op);
            proptest::prop_assert!(a.result <= 13);
        }
        // And the engine is still consistent: every mapping it shows is reachable.
        for m in e.mapping_views(None) {
            proptest::prop_assert_eq!(m.int_addr, u32_of(SUB));
        }
        e.advance(100_000 * SEC);
        proptest::prop_assert!(e.mapping_views(None).is_empty());
    }
}

#[derive(Debug, Clone)]
enum Op {
    Map { sub: bool, port: u16, suggest: u16, lifetime: u32, nonce: bool, filter: bool, prefer_failure: bool },
    Peer { port: u16, lifetime: u32, nonce: bool },
    Outbound { port: u16 },
    Inbound { port: u16 },
    Clear,
    Wait { secs: u64 },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let port = || prop_oneof![Just(5000u16), Just(5001), Just(5002), 1024u16..1030];
    let lifetime = || prop_oneof![Just(0u32), Just(60), Just(400), Just(5000)];
    prop_oneof![
        (any::<bool>(), port(), prop_oneof![Just(0u16), Just(5000), Just(40000), Just(1)], lifetime(), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(sub, port, suggest, lifetime, nonce, filter, prefer_failure)| Op::Map { sub, port, suggest, lifetime, nonce, filter, prefer_failure }),
        (port(), lifetime(), any::<bool>()).prop_map(|(port, lifetime, nonce)| Op::Peer { port, lifetime, nonce }),
        port().prop_map(|port| Op::Outbound { port }),
        prop_oneof![Just(5000u16), Just(40000), Just(1024)].prop_map(|port| Op::Inbound { port }),
        Just(Op::Clear),
        prop_oneof![Just(1u64), Just(100), Just(350), Just(3000)].prop_map(|secs| Op::Wait { secs }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
    /// Any mix of PCP requests, traffic, clearing and time leaves the books
    /// balanced: once everything has expired, no mapping, session, port or
    /// subscriber is left (counters that went wrong would also panic on
    /// underflow on the way).
    #[test]
    fn pcp_and_traffic_leave_balanced_books(ops in proptest::collection::vec(op(), 1..40), tight_quota in proptest::prelude::any::<bool>()) {
        let mut cfg = EngineConfig { filtering: Filtering::AddressDependent, ..pcp_config() };
        if tight_quota {
            cfg.max_ports_per_subscriber = 2;
            cfg.max_sessions_per_subscriber = 3;
            cfg.max_sessions_per_mapping = 1;
        }
        let mut e = engine(cfg);
        let mut now = SEC;
        for op in ops {
            match op {
                Op::Map { sub, port, suggest, lifetime, nonce, filter: f, prefer_failure } => {
                    let who = if sub { SUB } else { SUB2 };
                    let mut opts = Vec::new();
                    if f { opts.push(filter(PEER, 32, 0)); }
                    if prefer_failure { opts.push(option(2, &[])); }
                    let n = if nonce { NONCE } else { *b"other-nonce!" };
                    let a = answer(&mut e, who, &map_req(who, lifetime, n, 17, port, (suggest, [0; 4]), &opts), now);
                    proptest::prop_assert!(a.result <= 13);
                }
                Op::Peer { port, lifetime, nonce } => {
                    let n = if nonce { NONCE } else { *b"other-nonce!" };
                    answer(&mut e, SUB, &peer_req(SUB, lifetime, n, 17, port, (PEER, 53)), now);
                }
                Op::Outbound { port } => {
                    let mut f = udp_frame(Side::Inside, SUB, port, PEER, 53, 64, b"q", false);
                    run(&mut e, &mut f, Side::Inside, now);
                }
                Op::Inbound { port } => {
                    inbound(&mut e, PEER, 53, (POOL1, port), now);
                }
                Op::Clear => {
                    e.clear_subscriber(u32_of(SUB), |_| {});
                }
                Op::Wait { secs } => now += secs * SEC,
            }
            e.advance(now);
            outputs(&mut e);
            events(&mut e);
            let holds = e.pcp_holds();
            proptest::prop_assert!(holds.iter().all(|h| h.remaining_s <= 7200));
        }
        now += 20_000 * SEC;
        e.advance(now);
        now += 200 * SEC;
        e.advance(now);
        proptest::prop_assert!(e.mapping_views(None).is_empty());
        proptest::prop_assert!(e.session_views(None).is_empty());
        proptest::prop_assert!(e.pcp_holds().is_empty());
        proptest::prop_assert_eq!(e.pool().ports_in_use(), 0);
        proptest::prop_assert_eq!(e.subscribers().len(), 0);
    }
}
