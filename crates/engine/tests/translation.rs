//! Deterministic scenarios: ICMP errors in both directions (RFC 5508), hairpinning,
//! unsolicited SYN handling (RFC 5382 REQ-4), quota ICMP (RFC 6888), TTL expiry,
//! filtering modes (RFC 4787 REQ-8), port parity and hold-down (contract).

#![allow(clippy::too_many_arguments)]

mod common;

use common::*;
use etherparse::{icmpv4::DestUnreachableHeader, Icmpv4Type};
use natrix_engine::config::{Filtering, PortSelection};
use natrix_engine::{DropReason, Side, Verdict};

const SUB: [u8; 4] = [100, 64, 7, 9];
const SUB2: [u8; 4] = [100, 100, 1, 2];
const REMOTE: [u8; 4] = [198, 51, 100, 7];
const ROUTER: [u8; 4] = [192, 0, 2, 254];
const POOL1: [u8; 4] = [203, 0, 113, 5];

/// Sends a UDP datagram out and returns (original frame, translated frame).
fn udp_out(e: &mut natrix_engine::Engine, sub: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8], zero: bool, now: u64) -> (Vec<u8>, Vec<u8>) {
    let orig = udp_frame(Side::Inside, sub, sport, dst, dport, 64, payload, zero);
    let mut f = orig.clone();
    assert_eq!(e.process(&mut f, Side::Inside, now), Verdict::Forward(Side::Outside));
    (orig, f)
}

fn check_inbound_udp_error(zero: bool) {
    let mut e = engine(config());
    let payload = b"dns query bytes, longer than eight".to_vec();
    let (orig, xlated) = udp_out(&mut e, SUB, 5353, REMOTE, 53, &payload, zero, SEC);
    let x = must_decode(&xlated);
    let (ext_addr, ext_port) = (x.src(), x.udp().source_port);

    for from in [REMOTE, ROUTER] {
        let mut err = icmp_frame(Side::Outside, from, ext_addr, 50, port_unreachable(), &quote_of(&xlated));
        let err_in = err.clone();
        let v = e.process(&mut err, Side::Outside, 2 * SEC);
        assert_eq!(v, Verdict::Forward(Side::Inside), "ICMP error from {from:?}");
        assert!(outputs(&mut e).is_empty());
        assert_eq!(&err[..ETH_LEN], &err_in[..ETH_LEN]);
        let d = must_decode(&err);
        assert_eq!(d.src(), from, "outer source is the reporting host");
        assert_eq!(d.dst(), SUB, "outer destination is the subscriber");
        assert_eq!(d.ip.time_to_live, 49);
        assert!(matches!(d.icmp().icmp_type, Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Port)));
        let q = must_quoted(&d);
        assert_eq!(q.ip.source, SUB, "quoted source is the subscriber");
        assert_eq!(q.ip.destination, REMOTE);
        assert_eq!(q.sport(), 5353);
        assert_eq!(q.dport(), 53);
        assert_eq!(q.ip.total_len, x.ip.total_len);
        // Embedded UDP checksum: zero stays zero, otherwise it is the checksum of the
        // subscriber's original datagram again.
        let orig_csum = must_decode(&orig).udp().checksum;
        assert_eq!(q.udp_checksum(), orig_csum, "quoted UDP checksum (zero={zero})");
        let _ = ext_port;
    }
    // No mapping is refreshed or removed: a reply still works.
    let mut reply = udp_frame(Side::Outside, REMOTE, 53, ext_addr, ext_port, 64, b"answer", false);
    assert_eq!(e.process(&mut reply, Side::Outside, 3 * SEC), Verdict::Forward(Side::Inside));
}

#[test]
fn icmp_error_inbound_udp_round_trip() {
    check_inbound_udp_error(false);
}

#[test]
fn icmp_error_inbound_udp_zero_checksum_stays_zero() {
    check_inbound_udp_error(true);
}

#[test]
fn icmp_error_inbound_tcp_and_echo() {
    let mut e = engine(config());
    // TCP SYN out; a router answers host unreachable quoting it.
    let mut syn = tcp_frame(Side::Inside, SUB, 40001, REMOTE, 443, 64, TcpKind::Syn, 77, 0, &[]);
    assert_eq!(e.process(&mut syn, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let s = must_decode(&syn);
    let mut err = icmp_frame(Side::Outside, ROUTER, s.src(), 60, Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Host), &quote_of(&syn));
    assert_eq!(e.process(&mut err, Side::Outside, SEC + 1), Verdict::Forward(Side::Inside));
    let d = must_decode(&err);
    assert_eq!(d.dst(), SUB);
    let q = must_quoted(&d);
    assert_eq!((q.ip.source, q.sport()), (SUB, 40001));
    assert_eq!((q.ip.destination, q.dport()), (REMOTE, 443));

    // Echo request out; time exceeded quoting it.
    let mut ping = echo_frame(Side::Inside, SUB, REMOTE, 64, false, 0x4242, 1, b"ping payload");
    assert_eq!(e.process(&mut ping, Side::Inside, SEC + 2), Verdict::Forward(Side::Outside));
    let p = must_decode(&ping);
    let Icmpv4Type::EchoRequest(h) = p.icmp().icmp_type else { panic!("echo expected") };
    let mut err = icmp_frame(Side::Outside, ROUTER, p.src(), 60, Icmpv4Type::TimeExceeded(etherparse::icmpv4::TimeExceededCode::TtlExceededInTransit), &quote_of(&ping));
    let _ = h;
    assert_eq!(e.process(&mut err, Side::Outside, SEC + 3), Verdict::Forward(Side::Inside));
    let d = must_decode(&err);
    assert_eq!(d.dst(), SUB);
    let q = must_quoted(&d);
    assert_eq!(q.ip.source, SUB);
    assert_eq!(q.icmp_id(), 0x4242, "quoted echo identifier restored");
}

#[test]
fn icmp_error_bad_icmp_checksum_dropped() {
    let mut e = engine(config());
    let (_, xlated) = udp_out(&mut e, SUB, 5353, REMOTE, 53, b"payload!payload!", false, SEC);
    let x = must_decode(&xlated);
    let mut err = icmp_frame(Side::Outside, REMOTE, x.src(), 50, port_unreachable(), &quote_of(&xlated));
    let off = ETH_LEN + 20 + 2;
    err[off] ^= 0x5a;
    assert_eq!(e.process(&mut err, Side::Outside, 2 * SEC), Verdict::Drop(DropReason::IcmpBadChecksum));
    assert!(outputs(&mut e).is_empty());
}

#[test]
fn icmp_error_bad_embedded_ip_checksum_dropped() {
    let mut e = engine(config());
    let (_, xlated) = udp_out(&mut e, SUB, 5353, REMOTE, 53, b"payload!payload!", false, SEC);
    let x = must_decode(&xlated);
    let mut q = quote_of(&xlated);
    q[10] ^= 0x01; // quoted IPv4 header checksum; the ICMP checksum is computed over this.
    let mut err = icmp_frame(Side::Outside, REMOTE, x.src(), 50, port_unreachable(), &q);
    must_decode(&err); // outer frame itself is valid
    assert_eq!(e.process(&mut err, Side::Outside, 2 * SEC), Verdict::Drop(DropReason::IcmpEmbeddedInvalid));
    assert!(outputs(&mut e).is_empty());
}

#[test]
fn icmp_error_without_mapping_dropped() {
    let mut e = engine(config());
    let (_, xlated) = udp_out(&mut e, SUB, 5353, REMOTE, 53, b"payload!", false, SEC);
    let x = must_decode(&xlated);
    // Same error but quoting a different external port that has no mapping.
    let other = udp_frame(Side::Inside, x.src(), x.udp().source_port + 2, REMOTE, 53, 63, b"payload!", false);
    let mut err = icmp_frame(Side::Outside, REMOTE, x.src(), 50, port_unreachable(), &quote_of(&other));
    assert_eq!(e.process(&mut err, Side::Outside, 2 * SEC), Verdict::Drop(DropReason::IcmpErrorNoMapping));
}

#[test]
fn icmp_error_outbound_round_trip() {
    let mut e = engine(config());
    let (_, xlated) = udp_out(&mut e, SUB, 6000, REMOTE, 7000, b"hello", false, SEC);
    let x = must_decode(&xlated);
    let (ext_addr, ext_port) = (x.src(), x.udp().source_port);
    // Remote sends a datagram in; it is translated to the subscriber.
    let mut inb = udp_frame(Side::Outside, REMOTE, 7000, ext_addr, ext_port, 64, b"unwanted datagram", false);
    assert_eq!(e.process(&mut inb, Side::Outside, 2 * SEC), Verdict::Forward(Side::Inside));
    // The subscriber answers port unreachable quoting what it received.
    let mut err = icmp_frame(Side::Inside, SUB, REMOTE, 64, port_unreachable(), &quote_of(&inb));
    assert_eq!(e.process(&mut err, Side::Inside, 3 * SEC), Verdict::Forward(Side::Outside));
    let d = must_decode(&err);
    assert_eq!(d.src(), ext_addr, "outer source translated to the external address");
    assert_eq!(d.dst(), REMOTE);
    assert_eq!(d.ip.time_to_live, 63);
    let q = must_quoted(&d);
    assert_eq!((q.ip.source, q.sport()), (REMOTE, 7000));
    assert_eq!((q.ip.destination, q.dport()), (ext_addr, ext_port), "quoted destination is the external endpoint");
    // The quoted checksum equals the one the remote originally sent.
    let orig_inb = udp_frame(Side::Outside, REMOTE, 7000, ext_addr, ext_port, 64, b"unwanted datagram", false);
    assert_eq!(q.udp_checksum(), must_decode(&orig_inb).udp().checksum);
}

/// An address and port.
type Endpoint = ([u8; 4], u16);

/// SUB (port 5000) and SUB2 (port 6000) each with a UDP mapping to REMOTE;
/// returns the engine and their external endpoints.
fn two_subscribers_with_udp_mappings() -> (natrix_engine::Engine, Endpoint, Endpoint) {
    let mut e = engine(config());
    let (_, xa) = udp_out(&mut e, SUB, 5000, REMOTE, 9000, b"a", false, SEC);
    let xa = must_decode(&xa);
    let (ea, pa) = (xa.src(), xa.udp().source_port);
    let (_, xb) = udp_out(&mut e, SUB2, 6000, REMOTE, 9000, b"b", false, SEC + 1);
    let xb = must_decode(&xb);
    let (eb, pb) = (xb.src(), xb.udp().source_port);
    (e, (ea, pa), (eb, pb))
}

/// RFC 6888 REQ-11 on the hairpin path: a datagram to another
/// subscriber's mapping that cannot take a session more (its quota) is
/// refused with an ICMP error that quotes it as its sender sent it.
#[test]
fn a_hairpin_refused_for_the_peers_quota_is_answered_about_the_datagram_as_sent() {
    let mut e = engine(natrix_engine::EngineConfig { max_sessions_per_subscriber: 1, ..config() });
    let (_, xb) = udp_out(&mut e, SUB2, 6000, REMOTE, 9000, b"b", false, SEC);
    let xb = must_decode(&xb);
    let (eb, pb) = (xb.src(), xb.udp().source_port);
    let mut f = udp_frame(Side::Inside, SUB, 5000, eb, pb, 64, b"to b", false);
    assert_eq!(e.process(&mut f, Side::Inside, 2 * SEC), Verdict::Drop(natrix_engine::DropReason::SessionQuota));
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1, "one refusal");
    let (side, _, icmp) = &out[0];
    let d = must_decode(icmp);
    assert_eq!((*side, d.dst()), (Side::Inside, SUB), "to the sender");
    let q = must_quoted(&d);
    assert_eq!((q.ip.source, q.sport(), q.ip.destination, q.dport()), (SUB, 5000, eb, pb), "the datagram as sent");
}

#[test]
fn hairpin_udp() {
    let (mut e, (ea, pa), (eb, pb)) = two_subscribers_with_udp_mappings();

    // B -> A's external endpoint: leaves inside, from B's external endpoint.
    let mut f = udp_frame(Side::Inside, SUB2, 6000, ea, pa, 64, b"hairpin payload", false);
    assert_eq!(e.process(&mut f, Side::Inside, 2 * SEC), Verdict::Forward(Side::Inside));
    let d = must_decode(&f);
    assert_eq!((d.src(), d.udp().source_port), (eb, pb));
    assert_eq!((d.dst(), d.udp().destination_port), (SUB, 5000));
    assert_eq!(d.ip.time_to_live, 63);
    assert_eq!(d.payload, b"hairpin payload");

    // A answers B's external endpoint.
    let mut f = udp_frame(Side::Inside, SUB, 5000, eb, pb, 64, b"back", true);
    assert_eq!(e.process(&mut f, Side::Inside, 3 * SEC), Verdict::Forward(Side::Inside));
    let d = must_decode(&f);
    assert_eq!((d.src(), d.udp().source_port), (ea, pa));
    assert_eq!((d.dst(), d.udp().destination_port), (SUB2, 6000));
    assert_eq!(d.udp().checksum, 0);
}

#[test]
fn unsolicited_syn_answered_after_hold() {
    let mut e = engine(config_single(POOL1));
    let orig = tcp_frame(Side::Outside, REMOTE, 33333, POOL1, 8080, 64, TcpKind::Syn, 1, 0, &[]);
    let mut syn = orig.clone();
    let t0 = 10 * SEC;
    let v = e.process(&mut syn, Side::Outside, t0);
    assert!(matches!(v, Verdict::Drop(DropReason::UnsolicitedSyn) | Verdict::Held), "got {v:?}");
    assert!(outputs(&mut e).is_empty(), "nothing before the hold ends");
    e.advance(t0 + 5 * SEC);
    assert!(outputs(&mut e).is_empty(), "nothing 5 s in");
    e.advance(t0 + 6 * SEC + 1);
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1, "one ICMP port unreachable after 6 s");
    let (side, t, data) = &out[0];
    assert_eq!(*side, Side::Outside);
    assert!(*t >= t0 + 6 * SEC && *t <= t0 + 6 * SEC + 1, "time {t}");
    let d = must_decode(data);
    assert_eq!(d.eth.source, MAC_NAT_OUT, "Ethernet addresses swapped");
    assert_eq!(d.eth.destination, MAC_PEER);
    assert_eq!(d.src(), POOL1, "source is the SYN's destination");
    assert_eq!(d.dst(), REMOTE);
    assert!(matches!(d.icmp().icmp_type, Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Port)));
    let q = must_quoted(&d);
    assert_eq!((q.ip.source, q.sport()), (REMOTE, 33333));
    assert_eq!((q.ip.destination, q.dport()), (POOL1, 8080));
    e.finish();
    assert!(outputs(&mut e).is_empty());
}

#[test]
fn unsolicited_syn_silenced_by_outbound_syn() {
    let mut e = engine(config_single(POOL1));
    let mut syn = tcp_frame(Side::Outside, REMOTE, 33333, POOL1, 8080, 64, TcpKind::Syn, 1, 0, &[]);
    let t0 = 10 * SEC;
    let v = e.process(&mut syn, Side::Outside, t0);
    assert!(matches!(v, Verdict::Drop(DropReason::UnsolicitedSyn) | Verdict::Held), "got {v:?}");
    // Simultaneous open: the subscriber's SYN to that remote from port 8080 (preserved).
    let mut out = tcp_frame(Side::Inside, SUB, 8080, REMOTE, 33333, 64, TcpKind::Syn, 2, 0, &[]);
    assert_eq!(e.process(&mut out, Side::Inside, t0 + 2 * SEC), Verdict::Forward(Side::Outside));
    let d = must_decode(&out);
    assert_eq!((d.src(), d.tcp().source_port), (POOL1, 8080));
    e.advance(t0 + 7 * SEC);
    e.finish();
    assert!(outputs(&mut e).is_empty(), "held SYN must be dropped silently");
}

#[test]
fn unsolicited_syn_resolved_at_finish() {
    let mut e = engine(config_single(POOL1));
    let mut syn = tcp_frame(Side::Outside, REMOTE, 33333, POOL1, 8080, 64, TcpKind::Syn, 1, 0, &[]);
    e.process(&mut syn, Side::Outside, SEC);
    e.finish();
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1, 7 * SEC, "generated at the end of the hold");
}

#[test]
fn quota_answers_host_unreachable_from_inside_address() {
    let cfg = natrix_engine::EngineConfig { max_ports_per_subscriber: 2, ..config() };
    let mut e = engine(cfg);
    udp_out(&mut e, SUB, 1111, REMOTE, 53, b"1", false, SEC);
    udp_out(&mut e, SUB, 2222, REMOTE, 53, b"2", false, SEC + 1);
    let orig = udp_frame(Side::Inside, SUB, 3333, REMOTE, 53, 64, b"third flow", false);
    let mut f = orig.clone();
    assert_eq!(e.process(&mut f, Side::Inside, SEC + 2), Verdict::Drop(DropReason::PortQuota));
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1);
    let (side, _, data) = &out[0];
    assert_eq!(*side, Side::Inside);
    let d = must_decode(data);
    assert_eq!(d.eth.source, MAC_NAT_IN);
    assert_eq!(d.eth.destination, MAC_SUB);
    assert_eq!(d.src(), INSIDE_ADDR);
    assert_eq!(d.dst(), SUB);
    assert!(matches!(d.icmp().icmp_type, Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Host)));
    let q = must_quoted(&d);
    assert_eq!((q.ip.source, q.sport()), (SUB, 3333), "quotes the untranslated datagram");
    assert_eq!((q.ip.destination, q.dport()), (REMOTE, 53));
    // Existing mappings are unaffected.
    udp_out(&mut e, SUB, 1111, [192, 0, 2, 1], 53, b"1", false, SEC + 3);
}

#[test]
fn ttl_one_dropped_with_time_exceeded() {
    let mut e = engine(config());
    let mut f = udp_frame(Side::Inside, SUB, 4444, REMOTE, 53, 1, b"ttl one", false);
    assert_eq!(e.process(&mut f, Side::Inside, SEC), Verdict::Drop(DropReason::TtlExpired));
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, Side::Inside);
    let d = must_decode(&out[0].2);
    assert_eq!(d.dst(), SUB);
    assert!(matches!(d.icmp().icmp_type, Icmpv4Type::TimeExceeded(etherparse::icmpv4::TimeExceededCode::TtlExceededInTransit)));
    let q = must_quoted(&d);
    assert_eq!((q.ip.source, q.sport()), (SUB, 4444));
}

fn filtering_case(mode: Filtering, same_addr_other_port: bool, other_addr: bool) {
    let cfg = natrix_engine::EngineConfig { filtering: mode, ..config() };
    let mut e = engine(cfg);
    let (_, x) = udp_out(&mut e, SUB, 5000, REMOTE, 9000, b"x", false, SEC);
    let x = must_decode(&x);
    let (ea, pa) = (x.src(), x.udp().source_port);
    let mut ok = udp_frame(Side::Outside, REMOTE, 9000, ea, pa, 64, b"r", false);
    assert_eq!(e.process(&mut ok, Side::Outside, 2 * SEC), Verdict::Forward(Side::Inside), "{mode:?} same endpoint");
    let mut f = udp_frame(Side::Outside, REMOTE, 9001, ea, pa, 64, b"r", false);
    let want = if same_addr_other_port { Verdict::Forward(Side::Inside) } else { Verdict::Drop(DropReason::Filtered) };
    assert_eq!(e.process(&mut f, Side::Outside, 3 * SEC), want, "{mode:?} same address other port");
    let mut f = udp_frame(Side::Outside, [198, 51, 100, 99], 9000, ea, pa, 64, b"r", false);
    let want = if other_addr { Verdict::Forward(Side::Inside) } else { Verdict::Drop(DropReason::Filtered) };
    assert_eq!(e.process(&mut f, Side::Outside, 4 * SEC), want, "{mode:?} other address");
}

#[test]
fn filtering_modes() {
    filtering_case(Filtering::EndpointIndependent, true, true);
    filtering_case(Filtering::AddressDependent, true, false);
    filtering_case(Filtering::AddressAndPortDependent, false, false);
}

/// RFC 6888 REQ-5 (seed 004): remotes reaching a mapping through
/// endpoint-independent filtering make sessions only up to
/// `max_sessions_per_mapping`, so that they cannot spend the subscriber's
/// whole session quota through one mapping: the subscriber's other
/// mappings still open sessions, and a remote whose session is there still
/// gets through.
#[test]
fn remotes_reaching_a_mapping_stop_at_its_session_limit_and_the_subscriber_goes_on() {
    let cfg = natrix_engine::EngineConfig { max_sessions_per_mapping: 3, max_sessions_per_subscriber: 100, ..config() };
    let mut e = engine(cfg);
    let (_, x) = udp_out(&mut e, SUB, 5000, REMOTE, 9000, b"x", false, SEC);
    let x = must_decode(&x);
    let (ea, pa) = (x.src(), x.udp().source_port);
    let outsider = [198, 51, 100, 66];
    for (i, port) in [7001u16, 7002].into_iter().enumerate() {
        let mut f = udp_frame(Side::Outside, outsider, port, ea, pa, 64, b"in", false);
        assert_eq!(e.process(&mut f, Side::Outside, 2 * SEC + i as u64), Verdict::Forward(Side::Inside), "session {} of 3", i + 2);
    }
    let mut f = udp_frame(Side::Outside, outsider, 7003, ea, pa, 64, b"in", false);
    assert_eq!(e.process(&mut f, Side::Outside, 3 * SEC), Verdict::Drop(DropReason::MappingSessionQuota), "a fourth session");
    let mut again = udp_frame(Side::Outside, outsider, 7001, ea, pa, 64, b"in", false);
    assert_eq!(e.process(&mut again, Side::Outside, 4 * SEC), Verdict::Forward(Side::Inside), "an existing session");
    let mut reply = udp_frame(Side::Outside, REMOTE, 9000, ea, pa, 64, b"r", false);
    assert_eq!(e.process(&mut reply, Side::Outside, 4 * SEC), Verdict::Forward(Side::Inside), "the subscriber's own session");
    let _ = outputs(&mut e);
    // The subscriber's own new session through the full mapping is refused
    // as quota (RFC 6888 REQ-11: answered with ICMP), its other mappings not.
    let mut own = udp_frame(Side::Inside, SUB, 5000, [198, 51, 100, 8], 9000, 64, b"x", false);
    assert_eq!(e.process(&mut own, Side::Inside, 5 * SEC), Verdict::Drop(DropReason::MappingSessionQuota));
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1, "one refusal");
    let d = must_decode(&out[0].2);
    assert_eq!((out[0].0, d.dst()), (Side::Inside, SUB));
    assert!(matches!(d.icmp().icmp_type, Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Host)));
    udp_out(&mut e, SUB, 5001, [198, 51, 100, 8], 9000, b"x", false, 6 * SEC);
}

/// Without `max_sessions_per_mapping` (0, the default) a mapping takes
/// sessions up to the subscriber's limit alone.
#[test]
fn by_default_a_mappings_sessions_are_bounded_by_the_subscribers_limit_alone() {
    let mut e = engine(natrix_engine::EngineConfig { max_sessions_per_subscriber: 40, ..config() });
    let (_, x) = udp_out(&mut e, SUB, 5000, REMOTE, 9000, b"x", false, SEC);
    let x = must_decode(&x);
    let (ea, pa) = (x.src(), x.udp().source_port);
    for port in 7001..7040u16 {
        let mut f = udp_frame(Side::Outside, [198, 51, 100, 66], port, ea, pa, 64, b"in", false);
        assert_eq!(e.process(&mut f, Side::Outside, 2 * SEC), Verdict::Forward(Side::Inside), "port {port}");
    }
    let mut f = udp_frame(Side::Outside, [198, 51, 100, 66], 7040, ea, pa, 64, b"in", false);
    assert_eq!(e.process(&mut f, Side::Outside, 2 * SEC), Verdict::Drop(DropReason::SessionQuota));
}

#[test]
fn inbound_without_mapping_dropped() {
    let mut e = engine(config());
    let mut f = udp_frame(Side::Outside, REMOTE, 53, POOL1, 5555, 64, b"x", false);
    assert_eq!(e.process(&mut f, Side::Outside, SEC), Verdict::Drop(DropReason::NoMapping));
    let mut f = udp_frame(Side::Outside, REMOTE, 53, [198, 51, 100, 200], 5555, 64, b"x", false);
    assert_eq!(e.process(&mut f, Side::Outside, SEC), Verdict::Drop(DropReason::NotForPool));
}

#[test]
fn port_clash_keeps_parity() {
    for sel in [PortSelection::Preserve, PortSelection::Random] {
        let cfg = natrix_engine::EngineConfig { port_selection: sel, ..config_single(POOL1) };
        let mut e = engine(cfg);
        let mut seen = Vec::new();
        for (i, sub) in [[100, 64, 9, 1], [100, 64, 9, 2], [100, 64, 9, 3]].into_iter().enumerate() {
            let (_, x) = udp_out(&mut e, sub, 5001, REMOTE, 53, b"q", false, SEC + i as u64);
            let p = must_decode(&x).udp().source_port;
            assert_eq!(p % 2, 1, "{sel:?}: parity kept");
            assert!(p >= 1024);
            if sel == PortSelection::Preserve && i == 0 {
                assert_eq!(p, 5001, "first subscriber keeps its port");
            }
            assert!(!seen.contains(&p), "{sel:?}: external port reused");
            seen.push(p);
        }
    }
}

#[test]
fn released_port_held_down() {
    // One address, four ports: 2000..=2003; even ports are 2000 and 2002.
    let cfg = natrix_engine::EngineConfig { ports: (2000, 2003), ..config_single(POOL1) };
    let udp_s = u64::from(cfg.timeouts.udp_s);
    let mut e = engine(cfg);
    let (_, x) = udp_out(&mut e, SUB, 2000, REMOTE, 53, b"a", false, SEC);
    assert_eq!(must_decode(&x).udp().source_port, 2000);
    // Let A's mapping expire (tick the clock so expiry is not deferred).
    let mut t = SEC;
    while t < (udp_s + 5) * SEC {
        t += SEC;
        e.advance(t);
    }
    assert_eq!(e.tables().mapping_count(), 0, "A's mapping expired");
    // Within hold-down: B asking for 2000 must not get it.
    let (_, x) = udp_out(&mut e, SUB2, 2000, REMOTE, 53, b"b", false, t);
    let pb = must_decode(&x).udp().source_port;
    assert_ne!(pb, 2000, "port reused inside hold-down");
    assert_eq!(pb, 2002);
    // Well after hold-down (and after B's mapping expired too), 2000 is free again.
    let end = t + (udp_s + 130) * SEC;
    while t < end {
        t += SEC;
        e.advance(t);
    }
    let (_, x) = udp_out(&mut e, [100, 64, 50, 50], 2000, REMOTE, 53, b"c", false, t);
    assert_eq!(must_decode(&x).udp().source_port, 2000, "port free again after hold-down");
}

#[test]
fn hairpin_icmp_error() {
    let (mut e, (ea, pa), (eb, pb)) = two_subscribers_with_udp_mappings();
    // A -> B's external endpoint, hairpinned to B.
    let mut f = udp_frame(Side::Inside, SUB, 5000, eb, pb, 64, b"to b via hairpin", false);
    assert_eq!(e.process(&mut f, Side::Inside, 2 * SEC), Verdict::Forward(Side::Inside));
    let got = must_decode(&f);
    assert_eq!((got.src(), got.udp().source_port, got.dst()), (ea, pa, SUB2));
    // B answers port unreachable quoting what it received; it hairpins back to A.
    let mut err = icmp_frame(Side::Inside, SUB2, ea, 64, port_unreachable(), &quote_of(&f));
    assert_eq!(e.process(&mut err, Side::Inside, 3 * SEC), Verdict::Forward(Side::Inside));
    let d = must_decode(&err);
    assert_eq!(d.src(), eb, "outer source is B's external address");
    assert_eq!(d.dst(), SUB, "delivered to A");
    let q = must_quoted(&d);
    assert_eq!((q.ip.source, q.sport()), (SUB, 5000), "quoted source is A's internal endpoint");
    assert_eq!((q.ip.destination, q.dport()), (eb, pb), "quoted destination is B's external endpoint");
}

#[test]
fn inbound_syn_to_existing_mapping_forwarded() {
    let mut e = engine(config());
    let mut syn = tcp_frame(Side::Inside, SUB, 7000, REMOTE, 80, 64, TcpKind::Syn, 1, 0, &[]);
    assert_eq!(e.process(&mut syn, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let s = must_decode(&syn);
    let mut inb = tcp_frame(Side::Outside, [192, 0, 2, 77], 999, s.src(), s.tcp().source_port, 64, TcpKind::Syn, 5, 0, &[]);
    assert_eq!(e.process(&mut inb, Side::Outside, 2 * SEC), Verdict::Forward(Side::Inside));
    let d = must_decode(&inb);
    assert_eq!((d.dst(), d.tcp().destination_port), (SUB, 7000));
    e.finish();
    assert!(outputs(&mut e).is_empty());
}

#[test]
fn tcp_port_closed_by_rst_skips_hold_down() {
    let cfg = natrix_engine::EngineConfig { ports: (2000, 2003), ..config_single(POOL1) };
    let transitory = u64::from(cfg.timeouts.tcp_transitory_s);
    let mut e = engine(cfg);
    let mut f = tcp_frame(Side::Inside, SUB, 2000, REMOTE, 80, 64, TcpKind::Syn, 100, 0, &[]);
    assert_eq!(e.process(&mut f, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    assert_eq!(must_decode(&f).tcp().source_port, 2000);
    let mut f = tcp_frame(Side::Outside, REMOTE, 80, POOL1, 2000, 64, TcpKind::SynAck, 500, 101, &[]);
    assert_eq!(e.process(&mut f, Side::Outside, SEC + 1), Verdict::Forward(Side::Inside));
    let mut f = tcp_frame(Side::Inside, SUB, 2000, REMOTE, 80, 64, TcpKind::Ack, 101, 501, &[]);
    assert_eq!(e.process(&mut f, Side::Inside, SEC + 2), Verdict::Forward(Side::Outside));
    let mut f = tcp_frame(Side::Outside, REMOTE, 80, POOL1, 2000, 64, TcpKind::Rst, 501, 101, &[]);
    assert_eq!(e.process(&mut f, Side::Outside, SEC + 3), Verdict::Forward(Side::Inside));
    let mut t = SEC + 3;
    while e.tables().mapping_count() > 0 && t < (transitory + 10) * SEC {
        t += SEC;
        e.advance(t);
    }
    assert_eq!(e.tables().mapping_count(), 0, "mapping released after RST");
    let mut f = tcp_frame(Side::Inside, SUB2, 2000, REMOTE, 80, 64, TcpKind::Syn, 1, 0, &[]);
    assert_eq!(e.process(&mut f, Side::Inside, t + SEC), Verdict::Forward(Side::Outside));
    assert_eq!(must_decode(&f).tcp().source_port, 2000, "RST-closed TCP port is not held down");
}

#[test]
fn vlan_tag_kept_and_generated_frames_swap_macs() {
    let mut e = engine(config());
    let vid = etherparse::VlanId::try_new(42).unwrap();
    let build = |ttl: u8| {
        let b = etherparse::PacketBuilder::ethernet2(MAC_SUB, MAC_NAT_IN).single_vlan(vid).ipv4(SUB, REMOTE, ttl).udp(5000, 53);
        let mut v = Vec::new();
        b.write(&mut v, b"vlan tagged").unwrap();
        v
    };
    let orig = build(64);
    let mut f = orig.clone();
    assert_eq!(e.process(&mut f, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    assert_eq!(&f[..18], &orig[..18], "Ethernet header and 802.1Q tag unchanged");
    let d = must_decode(&f);
    assert!(in_pool(e.config(), d.src()));
    assert_eq!(d.ip.time_to_live, 63);
    assert_eq!(d.payload, b"vlan tagged");

    let mut f = build(1);
    assert_eq!(e.process(&mut f, Side::Inside, 2 * SEC), Verdict::Drop(DropReason::TtlExpired));
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1);
    let g = &out[0].2;
    assert_eq!(&g[0..6], &MAC_SUB, "destination MAC is the sender's");
    assert_eq!(&g[6..12], &MAC_NAT_IN);
    assert_eq!(&g[12..18], &orig[12..18], "VLAN tag kept");
    let d = must_decode(g);
    assert_eq!(d.dst(), SUB);
}

#[test]
fn fragments_out_of_order_held_then_released() {
    use etherparse::{Ethernet2Header, IpNumber, Ipv4Header, UdpHeader};
    let mut e = engine(config());
    let data: Vec<u8> = (0..64u8).collect();
    let probe = Ipv4Header::new(8 + data.len() as u16, 64, IpNumber::UDP, SUB, REMOTE).unwrap();
    let udp = UdpHeader::with_ipv4_checksum(5555, 53, &probe, &data).unwrap();
    let mut l4 = udp.to_bytes().to_vec();
    l4.extend_from_slice(&data);
    let eth = Ethernet2Header { source: MAC_SUB, destination: MAC_NAT_IN, ether_type: etherparse::EtherType::IPV4 };
    let frag = |off: usize, chunk: &[u8], more: bool| ipv4_fragment(&eth, SUB, REMOTE, 0x1234, off, chunk, more);
    let mut second = frag(32, &l4[32..], false);
    let mut first = frag(0, &l4[..32], true);
    assert_eq!(e.process(&mut second, Side::Inside, SEC), Verdict::Held);
    assert!(outputs(&mut e).is_empty());
    assert_eq!(e.process(&mut first, Side::Inside, SEC + 1000), Verdict::Forward(Side::Outside));
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1, "held fragment released after the first");
    assert_eq!(out[0].0, Side::Outside);
    let d1 = must_decode(&first);
    let d2 = must_decode(&out[0].2);
    assert!(in_pool(e.config(), d1.src()));
    assert_eq!(d2.src(), d1.src(), "non-first fragment translated too");
    assert_eq!(d2.dst(), REMOTE);
    assert_eq!(d2.ip.time_to_live, 63);
    assert_eq!(d2.ip.identification, d1.ip.identification);
    assert_eq!(d2.ip.fragment_offset.value(), 4);
    // Reassemble the translated datagram and check its UDP checksum with etherparse.
    let mut whole = d1.payload.clone();
    whole.extend_from_slice(&d2.payload);
    let (uh, body) = UdpHeader::from_slice(&whole).unwrap();
    assert_eq!(uh.destination_port, 53);
    assert_eq!(body, &data[..]);
    let ip = Ipv4Header::new(whole.len() as u16, 63, IpNumber::UDP, d1.src(), REMOTE).unwrap();
    assert_eq!(uh.calc_checksum_ipv4(&ip, body).unwrap(), uh.checksum, "reassembled UDP checksum");
}

#[test]
fn exempt_destination_passes_untranslated() {
    let cfg = natrix_engine::EngineConfig { exempt: vec![natrix_engine::config::Exemption { network: u32_of([192, 0, 2, 0]), prefix_len: 24, ports: (0, 65535) }], ..config() };
    let mut e = engine(cfg);
    let mut f = udp_frame(Side::Inside, SUB, 5000, [192, 0, 2, 9], 53, 64, b"exempt", false);
    assert_eq!(e.process(&mut f, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let d = must_decode(&f);
    assert_eq!((d.src(), d.udp().source_port), (SUB, 5000));
    assert_eq!(d.ip.time_to_live, 63);
    assert_eq!(e.tables().mapping_count(), 0);
    // Not exempt: translated.
    let (_, x) = udp_out(&mut e, SUB, 5000, REMOTE, 53, b"x", false, 2 * SEC);
    assert!(in_pool(e.config(), must_decode(&x).src()));
}

/// The test config with one static mapping: the server 100.64.0.5 at
/// `int_port`, reached at 203.0.113.1:`ext_port`.
fn with_static(proto: natrix_engine::Proto, int_port: u16, ext_port: u16) -> natrix_engine::EngineConfig {
    let forward = natrix_engine::config::StaticMapping { proto, int_addr: u32_of([100, 64, 0, 5]), int_port, ext_addr: u32_of([203, 0, 113, 1]), ext_port };
    natrix_engine::EngineConfig { statics: vec![forward], ..config() }
}

/// A static mapping (a port forward) is open to every remote by design:
/// `max_sessions_per_mapping` leaves it to the subscriber's limit.
#[test]
fn a_static_mapping_serves_remotes_past_the_per_mapping_limit() {
    let mut e = engine(natrix_engine::EngineConfig { max_sessions_per_mapping: 2, ..with_static(natrix_engine::Proto::Udp, 53, 5353) });
    for port in 40000..40005u16 {
        let mut f = udp_frame(Side::Outside, REMOTE, port, [203, 0, 113, 1], 5353, 64, b"q", false);
        assert_eq!(e.process(&mut f, Side::Outside, SEC), Verdict::Forward(Side::Inside), "remote port {port}");
    }
}

#[test]
fn static_mapping_accepts_inbound() {
    let mut e = engine(with_static(natrix_engine::Proto::Tcp, 22, 2222));
    let mut f = tcp_frame(Side::Outside, REMOTE, 40000, [203, 0, 113, 1], 2222, 64, TcpKind::Syn, 1, 0, &[]);
    assert_eq!(e.process(&mut f, Side::Outside, SEC), Verdict::Forward(Side::Inside));
    let d = must_decode(&f);
    assert_eq!((d.dst(), d.tcp().destination_port), ([100, 64, 0, 5], 22));
    let mut f = tcp_frame(Side::Inside, [100, 64, 0, 5], 22, REMOTE, 40000, 64, TcpKind::SynAck, 9, 2, &[]);
    assert_eq!(e.process(&mut f, Side::Inside, SEC + 1), Verdict::Forward(Side::Outside));
    let d = must_decode(&f);
    assert_eq!((d.src(), d.tcp().source_port), ([203, 0, 113, 1], 2222));
}

#[test]
fn martian_and_local_destination_dropped() {
    let mut e = engine(config());
    for (src, dst) in [([127, 0, 0, 1], REMOTE), (SUB, [224, 0, 0, 5]), (SUB, [255, 255, 255, 255]), ([0, 1, 2, 3], REMOTE), (SUB, [127, 9, 9, 9])] {
        let mut f = udp_frame(Side::Inside, src, 1000, dst, 53, 64, b"m", false);
        assert_eq!(e.process(&mut f, Side::Inside, SEC), Verdict::Drop(DropReason::Martian), "{src:?} -> {dst:?}");
    }
    let mut f = udp_frame(Side::Inside, SUB, 1000, INSIDE_ADDR, 53, 64, b"m", false);
    assert_eq!(e.process(&mut f, Side::Inside, SEC), Verdict::Drop(DropReason::LocalDestination));
    assert_eq!(e.tables().mapping_count(), 0);
}

#[test]
fn udp_mapping_refreshed_by_outbound_only() {
    let mut e = engine(config());
    let (_, x) = udp_out(&mut e, SUB, 5000, REMOTE, 53, b"x", false, SEC);
    let x = must_decode(&x);
    let (ea, pa) = (x.src(), x.udp().source_port);
    let inbound = |e: &mut natrix_engine::Engine, t: u64| {
        let mut f = udp_frame(Side::Outside, REMOTE, 53, ea, pa, 64, b"r", false);
        e.process(&mut f, Side::Outside, t)
    };
    // Inbound traffic at 200 s is forwarded but does not refresh (inbound_refresh = false).
    assert_eq!(inbound(&mut e, 200 * SEC), Verdict::Forward(Side::Inside));
    // At 1 s + 300 s + margin the mapping is gone.
    assert_eq!(inbound(&mut e, 310 * SEC), Verdict::Drop(DropReason::NoMapping));

    // Outbound refresh keeps it alive.
    let (_, x) = udp_out(&mut e, SUB, 5002, REMOTE, 53, b"x", false, 400 * SEC);
    let x = must_decode(&x);
    let (eb, pb) = (x.src(), x.udp().source_port);
    udp_out(&mut e, SUB, 5002, REMOTE, 53, b"x", false, 650 * SEC);
    let mut f = udp_frame(Side::Outside, REMOTE, 53, eb, pb, 64, b"r", false);
    assert_eq!(e.process(&mut f, Side::Outside, 900 * SEC), Verdict::Forward(Side::Inside));
}

#[test]
fn exhaustion_icmp_code_variants() {
    // ICMP code 13 is "communication administratively prohibited" (RFC 1812), which
    // etherparse names FilterProhibited.
    for (code, want) in [(Some(13u8), Some(DestUnreachableHeader::FilterProhibited)), (None, None)] {
        let cfg = natrix_engine::EngineConfig { max_ports_per_subscriber: 1, exhaustion_icmp_code: code, ..config() };
        let mut e = engine(cfg);
        udp_out(&mut e, SUB, 1111, REMOTE, 53, b"1", false, SEC);
        let mut f = udp_frame(Side::Inside, SUB, 2222, REMOTE, 53, 64, b"2", false);
        assert_eq!(e.process(&mut f, Side::Inside, SEC + 1), Verdict::Drop(DropReason::PortQuota));
        let out = outputs(&mut e);
        match want {
            None => assert!(out.is_empty(), "exhaustion_icmp none stays silent"),
            Some(w) => {
                assert_eq!(out.len(), 1);
                let d = must_decode(&out[0].2);
                assert_eq!(d.src(), INSIDE_ADDR);
                assert_eq!(d.icmp().icmp_type, Icmpv4Type::DestinationUnreachable(w));
            }
        }
    }
}

#[test]
fn new_mapping_rate_limit() {
    let cfg = natrix_engine::EngineConfig { max_new_mappings_per_second: 2, ..config() };
    let mut e = engine(cfg);
    udp_out(&mut e, SUB, 1001, REMOTE, 53, b"1", false, SEC);
    udp_out(&mut e, SUB, 1003, REMOTE, 53, b"2", false, SEC + 1000);
    let mut f = udp_frame(Side::Inside, SUB, 1005, REMOTE, 53, 64, b"3", false);
    assert_eq!(e.process(&mut f, Side::Inside, SEC + 2000), Verdict::Drop(DropReason::RateLimited));
    // Existing mappings still work within the same second.
    udp_out(&mut e, SUB, 1001, [192, 0, 2, 8], 53, b"1", false, SEC + 3000);
    // A later second allows new mappings again.
    udp_out(&mut e, SUB, 1005, REMOTE, 53, b"3", false, 3 * SEC);
}
