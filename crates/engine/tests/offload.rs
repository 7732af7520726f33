//! `Engine::may_offload`: which flows an offload may forward without the
//! engine. Only a flow whose every plain segment the engine would translate
//! the same way: a UDP session, or a TCP session that RFC 5382's tracking
//! has seen open both ways and neither close nor reset (a FIN or RST
//! changes its timeout class, RFC 5382 REQ-5, RFC 7857 section 2.2), with
//! no middlebox function wanting its segments.

mod common;

use common::*;
use natrix_engine::pipeline::hooks::{FrameInfo, HookVerdict, Interest, Middlebox, Point};
use natrix_engine::{Engine, Side, Verdict};

const SUB: [u8; 4] = [100, 64, 0, 10];
const SERVER: [u8; 4] = [198, 51, 100, 7];

/// Processes `frame` arriving on `side`; returns the frame before and after.
fn pass(e: &mut Engine, frame: Vec<u8>, side: Side, now: u64) -> (Vec<u8>, Vec<u8>) {
    let mut out = frame.clone();
    assert!(matches!(e.process(&mut out, side, now), Verdict::Forward(_)), "forwarded");
    (frame, out)
}

/// The external endpoint a translated outbound frame carries (decoded and
/// its checksums verified by etherparse).
fn external(out: &[u8]) -> ([u8; 4], u16) {
    let d = must_decode(out);
    let port = match &d.l4 {
        L4::Udp(u) => u.source_port,
        L4::Tcp(t) => t.source_port,
        other => panic!("not TCP or UDP: {other:?}"),
    };
    (d.src(), port)
}

#[test]
fn a_udp_flow_may_be_offloaded_both_ways_once_it_has_a_session() {
    let mut e = engine(config());
    let first = udp_frame(Side::Inside, SUB, 5000, SERVER, 53, 64, b"a query, 12+ bytes", false);
    assert!(!e.may_offload(&first, Side::Inside), "no session yet");
    let (before, after) = pass(&mut e, first, Side::Inside, SEC);
    assert!(e.may_offload(&before, Side::Inside));
    let (ext, port) = external(&after);
    let reply = udp_frame(Side::Outside, SERVER, 53, ext, port, 64, b"an answer, 12+ bytes", false);
    assert!(e.may_offload(&reply, Side::Outside));
    let stranger = udp_frame(Side::Outside, [198, 51, 100, 8], 53, ext, port, 64, b"an answer, 12+ bytes", false);
    assert!(!e.may_offload(&stranger, Side::Outside), "another remote has no session");
}

#[test]
fn a_tcp_flow_may_be_offloaded_only_between_its_handshake_and_its_close() {
    let mut e = engine(config());
    let syn = tcp_frame(Side::Inside, SUB, 40000, SERVER, 443, 64, TcpKind::Syn, 1, 0, &[]);
    let (_, out) = pass(&mut e, syn, Side::Inside, SEC);
    let (ext, port) = external(&out);
    let data_out = tcp_frame(Side::Inside, SUB, 40000, SERVER, 443, 64, TcpKind::Ack, 2, 1, b"data");
    let data_in = tcp_frame(Side::Outside, SERVER, 443, ext, port, 64, TcpKind::Ack, 1, 2, b"data");
    assert!(!e.may_offload(&data_out, Side::Inside), "SYN seen one way only");
    pass(&mut e, tcp_frame(Side::Outside, SERVER, 443, ext, port, 64, TcpKind::SynAck, 1, 2, &[]), Side::Outside, SEC);
    pass(&mut e, data_out.clone(), Side::Inside, SEC);
    assert!(e.may_offload(&data_out, Side::Inside), "established");
    assert!(e.may_offload(&data_in, Side::Outside), "established, inbound");
    pass(&mut e, tcp_frame(Side::Inside, SUB, 40000, SERVER, 443, 64, TcpKind::Fin, 6, 1, &[]), Side::Inside, SEC);
    assert!(!e.may_offload(&data_out, Side::Inside), "closing");
    assert!(!e.may_offload(&data_in, Side::Outside), "closing, inbound");
}

#[test]
fn a_reset_ends_what_may_be_offloaded() {
    let mut e = engine(config());
    let (_, out) = pass(&mut e, tcp_frame(Side::Inside, SUB, 40001, SERVER, 443, 64, TcpKind::Syn, 1, 0, &[]), Side::Inside, SEC);
    let (ext, port) = external(&out);
    pass(&mut e, tcp_frame(Side::Outside, SERVER, 443, ext, port, 64, TcpKind::SynAck, 1, 2, &[]), Side::Outside, SEC);
    let data_out = tcp_frame(Side::Inside, SUB, 40001, SERVER, 443, 64, TcpKind::Ack, 2, 2, b"x");
    assert!(e.may_offload(&data_out, Side::Inside));
    pass(&mut e, tcp_frame(Side::Outside, SERVER, 443, ext, port, 64, TcpKind::Rst, 2, 2, &[]), Side::Outside, SEC);
    assert!(!e.may_offload(&data_out, Side::Inside));
}

#[test]
fn hairpins_and_frames_to_the_nat_itself_are_not_offloaded() {
    let mut e = engine(config());
    let (_, out) = pass(&mut e, udp_frame(Side::Inside, SUB, 5001, SERVER, 53, 64, b"a query, 12+ bytes", false), Side::Inside, SEC);
    let (ext, port) = external(&out);
    let hairpin = udp_frame(Side::Inside, [100, 64, 0, 11], 6000, ext, port, 64, b"to a neighbour", false);
    assert!(!e.may_offload(&hairpin, Side::Inside));
    let to_nat = udp_frame(Side::Inside, SUB, 5001, INSIDE_ADDR, 53, 64, b"a query, 12+ bytes", false);
    assert!(!e.may_offload(&to_nat, Side::Inside));
}

/// A function that wants every frame of one protocol.
struct Watcher(u8);

impl Middlebox for Watcher {
    fn point(&self) -> Point {
        Point::BeforeTranslation
    }

    fn interest(&self) -> Interest {
        Interest::protocol(self.0)
    }

    fn on_frame(&mut self, _frame: &mut [u8], _info: &FrameInfo) -> HookVerdict {
        HookVerdict::Continue
    }
}

#[test]
fn flows_a_middlebox_function_wants_are_not_offloaded() {
    let mut e = engine(config());
    e.add_middlebox(Box::new(Watcher(natrix_wire::proto::UDP)));
    let (before, _) = pass(&mut e, udp_frame(Side::Inside, SUB, 5002, SERVER, 53, 64, b"a query, 12+ bytes", false), Side::Inside, SEC);
    assert!(!e.may_offload(&before, Side::Inside), "the function must see every datagram");
}

#[test]
fn a_function_wanting_only_syns_leaves_established_flows_to_the_offload() {
    let mut e = engine(config());
    e.add_middlebox(Box::new(SynWatcher));
    let (_, out) = pass(&mut e, tcp_frame(Side::Inside, SUB, 40002, SERVER, 443, 64, TcpKind::Syn, 1, 0, &[]), Side::Inside, SEC);
    let (ext, port) = external(&out);
    pass(&mut e, tcp_frame(Side::Outside, SERVER, 443, ext, port, 64, TcpKind::SynAck, 1, 2, &[]), Side::Outside, SEC);
    let data_out = tcp_frame(Side::Inside, SUB, 40002, SERVER, 443, 64, TcpKind::Ack, 2, 2, b"x");
    assert!(e.may_offload(&data_out, Side::Inside));
}

/// A function that wants SYN segments only (as the SYN accelerator does).
struct SynWatcher;

impl Middlebox for SynWatcher {
    fn point(&self) -> Point {
        Point::BeforeTranslation
    }

    fn interest(&self) -> Interest {
        Interest::tcp(0x02)
    }

    fn on_frame(&mut self, _frame: &mut [u8], _info: &FrameInfo) -> HookVerdict {
        HookVerdict::Continue
    }
}

/// The idle seconds of the one session of `sub`'s port `port`.
fn idle_of(e: &Engine, port: u16) -> u32 {
    let views = e.session_views(None);
    views.iter().find(|v| v.int_port == port).map(|v| v.idle_s).expect("the session")
}

#[test]
fn an_offloaded_flow_s_outbound_frames_refresh_its_session() {
    let mut e = engine(config());
    let (before, _) = pass(&mut e, udp_frame(Side::Inside, SUB, 5003, SERVER, 53, 64, b"a query, 12+ bytes", false), Side::Inside, SEC);
    e.advance(61 * SEC);
    assert_eq!(idle_of(&e, 5003), 60);
    assert!(e.refresh_offloaded(&before, Side::Inside));
    assert_eq!(idle_of(&e, 5003), 0, "outbound frames refresh (RFC 4787 REQ-6)");
}

#[test]
fn inbound_frames_refresh_only_where_inbound_refresh_is_on() {
    for inbound_refresh in [false, true] {
        let mut e = engine(natrix_engine::EngineConfig { inbound_refresh, ..config() });
        let (_, out) = pass(&mut e, udp_frame(Side::Inside, SUB, 5004, SERVER, 53, 64, b"a query, 12+ bytes", false), Side::Inside, SEC);
        let (ext, port) = external(&out);
        let reply = udp_frame(Side::Outside, SERVER, 53, ext, port, 64, b"an answer, 12+ bytes", false);
        e.advance(61 * SEC);
        assert!(e.refresh_offloaded(&reply, Side::Outside), "still steady");
        let expected = if inbound_refresh { 0 } else { 60 };
        assert_eq!(idle_of(&e, 5004), expected, "inbound_refresh = {inbound_refresh} (RFC 4787 REQ-6)");
    }
}

#[test]
fn a_flow_no_longer_steady_is_not_refreshed() {
    let mut e = engine(config());
    let (_, out) = pass(&mut e, tcp_frame(Side::Inside, SUB, 40003, SERVER, 443, 64, TcpKind::Syn, 1, 0, &[]), Side::Inside, SEC);
    let (ext, port) = external(&out);
    pass(&mut e, tcp_frame(Side::Outside, SERVER, 443, ext, port, 64, TcpKind::SynAck, 1, 2, &[]), Side::Outside, SEC);
    let data_out = tcp_frame(Side::Inside, SUB, 40003, SERVER, 443, 64, TcpKind::Ack, 2, 2, b"x");
    pass(&mut e, tcp_frame(Side::Inside, SUB, 40003, SERVER, 443, 64, TcpKind::Fin, 2, 2, &[]), Side::Inside, 2 * SEC);
    e.advance(30 * SEC);
    assert!(!e.refresh_offloaded(&data_out, Side::Inside), "closing: the offload must hand it back");
    assert_eq!(idle_of(&e, 40003), 28, "and its session is left as it was");
}
