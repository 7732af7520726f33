"""TCP translation and state handling (RFC 5382, RFC 7857 sec 2)."""

import pytest

import natrix_harness as h
from natrix_harness import (
    IP, POOL1, POOL28, SRV1, SRV2, SUB_A, SUB_B, T0, TCP, UDP, Ether, icmp_info, in_net, none_of, one, pick,
    tcp_in, tcp_out, tcp_seq, udp_out,
)


def test_tcp_full_connection(replay):
    """RFC 5382 REQ-1/REQ-2: a NAT MUST support all valid TCP packet sequences:
    handshake, data both ways and FIN close in both directions are translated
    consistently (same external address:port, sequence numbers untouched, valid
    checksums, TTL-1)."""
    s = h.Scenario(replay, h.make_config(pool=[POOL28]))
    s.add(T0, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "S", seq=1000))
    outs, _ = s.run()
    syn = one(outs, "outside", tcp_seq(1000, "S")).pkt
    ext = syn[IP].src
    port = syn[TCP].sport
    assert in_net(ext, POOL28) and port == 40000 and syn[IP].ttl == 63
    seq_in = [
        (T0 + 0.1, "outside", tcp_in(SRV1, 80, ext, port, "SA", seq=5000, ack=1001)),
        (T0 + 0.2, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "A", seq=1001, ack=5001)),
        (T0 + 0.3, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "PA", seq=1001, ack=5001, payload=b"GET / HTTP/1.0\r\n\r\n")),
        (T0 + 0.4, "outside", tcp_in(SRV1, 80, ext, port, "PA", seq=5001, ack=1019, payload=b"HTTP/1.0 200 OK\r\n\r\n")),
        (T0 + 0.5, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "FA", seq=1019, ack=5020)),
        (T0 + 0.6, "outside", tcp_in(SRV1, 80, ext, port, "FA", seq=5020, ack=1020)),
        (T0 + 0.7, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "A", seq=1020, ack=5021)),
    ]
    for f in seq_in:
        s.add(*f)
    outs, _ = s.run()
    for ts, side, pkt in seq_in:
        t = pkt[TCP]
        out_side = "outside" if side == "inside" else "inside"
        o = one(outs, out_side, lambda p, t=t: h.is_tcp(p) and p[TCP].seq == t.seq and p[TCP].flags == t.flags
                and p[TCP].ack == t.ack, f"{t.flags} seq={t.seq}")
        p = o.pkt
        assert abs(o.ts - ts) < 1e-6
        assert p[IP].ttl == 63
        assert h.l4_data(p) == bytes(t.payload)
        if side == "inside":
            assert (p[IP].src, p[TCP].sport, p[IP].dst, p[TCP].dport) == (ext, port, SRV1, 80)
        else:
            assert (p[IP].src, p[TCP].sport, p[IP].dst, p[TCP].dport) == (SRV1, 80, SUB_A, 40000)


def test_tcp_endpoint_independent_mapping(replay):
    """RFC 5382 REQ-1: TCP mappings are Endpoint-Independent: the same internal
    address:port connecting to two servers uses one external address:port."""
    s = h.Scenario(replay, h.make_config(pool=[POOL28]))
    s.add(T0, "inside", tcp_out(SUB_A, 40010, SRV1, 80, "S", seq=1))
    s.add(T0 + 0.1, "inside", tcp_out(SUB_A, 40010, SRV2, 443, "S", seq=2))
    outs, _ = s.run()
    a = one(outs, "outside", tcp_seq(1, "S")).pkt
    b = one(outs, "outside", tcp_seq(2, "S")).pkt
    assert in_net(a[IP].src, POOL28), "not translated"
    assert (a[IP].src, a[TCP].sport) == (b[IP].src, b[TCP].sport)


def _unsolicited_icmp_checks(outs, syn_frame, syn_ts, latest):
    errs = pick(outs, None, h.is_icmp_error)
    assert len(errs) == 1, f"expected one ICMP port unreachable\n{h.dump(outs)}"
    e = errs[0]
    assert e.side == "outside"
    t, c, emb = icmp_info(e.pkt)
    assert (t, c) == (3, 3)
    assert e.pkt[IP].src == POOL1, "ICMP must come from the SYN's destination address (contract)"
    assert e.pkt[IP].dst == SRV1
    assert e.ts >= syn_ts + 6.0 - 1e-6, f"ICMP sent after {e.ts - syn_ts:.3f} s, RFC 5382 REQ-4 needs >= 6 s"
    assert e.ts <= latest + 1e-6
    assert e.pkt[Ether].src == syn_frame[Ether].dst and e.pkt[Ether].dst == syn_frame[Ether].src
    assert emb.header_checksum_ok
    assert (emb.src, emb.dst, emb.sport, emb.dport, emb.proto) == (SRV1, POOL1, 5555, 40000, 6)


@pytest.mark.parametrize("trailing", [True, False])
def test_unsolicited_syn_icmp_after_six_seconds(replay, trailing):
    """RFC 5382 REQ-4: a NAT MUST NOT respond to an unsolicited inbound SYN for
    at least 6 s; if no outbound SYN for the connection is translated meanwhile
    it SHOULD send ICMP Port Unreachable (3/3) for it. The SYN itself is never
    forwarded. (Contract: pending holds are resolved at the end of a replay as if
    6 s had passed, so the ICMP appears even when the capture ends earlier.)"""
    s = h.Scenario(replay, h.make_config())
    syn = s.add(T0, "outside", tcp_in(SRV1, 5555, POOL1, 40000, "S", seq=7000))
    latest = T0 + 6.0
    if trailing:
        s.add(T0 + 10, "inside", udp_out(SUB_B, 40100, SRV2, 53, b"time-passes"))
        latest = T0 + 10
    outs, rep = s.run()
    none_of(outs, "inside", lambda p: h.is_tcp(p), "forwarded unsolicited SYN")
    _unsolicited_icmp_checks(outs, syn, T0, latest)
    assert rep["drops"].get("unsolicited_syn", 0) == 1, rep["drops"]


def test_unsolicited_syn_then_outbound_syn_is_dropped_silently(replay):
    """RFC 5382 REQ-4: if during the 6 s the NAT receives and translates an
    outbound SYN for the connection, it MUST silently drop the original
    unsolicited inbound SYN: no ICMP and the held SYN is not forwarded."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "outside", tcp_in(SRV1, 5555, POOL1, 40000, "S", seq=7000))
    s.add(T0 + 2, "inside", tcp_out(SUB_A, 40000, SRV1, 5555, "S", seq=8000))
    s.add(T0 + 10, "inside", udp_out(SUB_B, 40100, SRV2, 53, b"time-passes"))
    outs, _ = s.run()
    o = one(outs, "outside", tcp_seq(8000, "S")).pkt
    assert (o[IP].src, o[TCP].sport) == (POOL1, 40000), "precondition: outbound SYN uses the held SYN's port"
    none_of(outs, "inside", tcp_seq(7000), "held unsolicited SYN")
    none_of(outs, None, h.is_icmp, "ICMP")


def test_unsolicited_syn_drop_mode(replay):
    """RFC 5382 REQ-4: the NAT MUST silently drop the SYN if sending a response
    violates its security policy (contract unsolicited_syn = "drop")."""
    s = h.Scenario(replay, h.make_config(nat={"unsolicited_syn": "drop"}))
    s.add(T0, "outside", tcp_in(SRV1, 5555, POOL1, 40000, "S", seq=7000))
    s.add(T0 + 10, "inside", udp_out(SUB_B, 40100, SRV2, 53, b"time-passes"))
    outs, rep = s.run()
    none_of(outs, None, h.is_icmp, "ICMP")
    none_of(outs, None, h.is_tcp, "forwarded SYN")
    assert rep["drops"].get("unsolicited_syn", 0) == 1, rep["drops"]


def test_simultaneous_open(replay):
    """RFC 5382 REQ-2: a NAT MUST handle TCP simultaneous open: after the
    subscriber's SYN created the mapping, an inbound SYN (not SYN-ACK) from the
    peer is forwarded, as is the peer's SYN-ACK; with endpoint-independent
    filtering a SYN from another host to the mapping passes too (contract)."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", tcp_out(SUB_A, 40000, SRV1, 5555, "S", seq=8000))
    s.add(T0 + 0.5, "outside", tcp_in(SRV1, 5555, POOL1, 40000, "S", seq=7000))
    s.add(T0 + 0.6, "inside", tcp_out(SUB_A, 40000, SRV1, 5555, "SA", seq=8000, ack=7001))
    s.add(T0 + 0.7, "outside", tcp_in(SRV1, 5555, POOL1, 40000, "SA", seq=7000, ack=8001))
    s.add(T0 + 0.8, "outside", tcp_in(SRV2, 6666, POOL1, 40000, "S", seq=9000))
    outs, _ = s.run()
    assert one(outs, "outside", tcp_seq(8000, "S")).pkt[TCP].sport == 40000
    p = one(outs, "inside", tcp_seq(7000, "S"), "peer's simultaneous-open SYN").pkt
    assert (p[IP].src, p[TCP].sport, p[IP].dst, p[TCP].dport) == (SRV1, 5555, SUB_A, 40000)
    one(outs, "outside", tcp_seq(8000, "SA"))
    one(outs, "inside", tcp_seq(7000, "SA"))
    p = one(outs, "inside", tcp_seq(9000, "S"), "SYN from another host (EIF)").pkt
    assert (p[IP].dst, p[TCP].dport) == (SUB_A, 40000)
    none_of(outs, None, h.is_icmp, "ICMP")


def _establish(s, port=40000):
    s.add(T0, "inside", tcp_out(SUB_A, port, SRV1, 80, "S", seq=1000))
    s.add(T0 + 0.05, "outside", tcp_in(SRV1, 80, POOL1, port, "SA", seq=5000, ack=1001))
    s.add(T0 + 0.1, "inside", tcp_out(SUB_A, port, SRV1, 80, "A", seq=1001, ack=5001))


def test_tcp_established_idle_timeout(replay):
    """RFC 5382 REQ-5: the established connection idle-timeout MUST NOT be less
    than 2 hours 4 minutes: after 2h03m20s of silence the connection still
    translates both ways on the same external port."""
    s = h.Scenario(replay, h.make_config())
    _establish(s)
    late = T0 + 0.1 + 7400
    s.add(late, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5001, ack=1001, payload=b"late-in"))
    s.add(late + 0.1, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "PA", seq=1001, ack=5008, payload=b"late-out"))
    outs, _ = s.run()
    i = one(outs, "inside", h.has_payload(b"late-in"), "data after 2h03m idle").pkt
    assert (i[IP].dst, i[TCP].dport) == (SUB_A, 40000)
    o = one(outs, "outside", h.has_payload(b"late-out")).pkt
    assert (o[IP].src, o[TCP].sport) == (POOL1, 40000)


@pytest.mark.parametrize("delay,forwarded", [(230, True), (270, False)])
def test_tcp_transitory_timeout(replay, delay, forwarded):
    """RFC 5382 REQ-5: the transitory connection idle-timeout MUST NOT be less
    than 4 minutes (contract tcp_transitory = 4m): a connection with only an
    outbound SYN still accepts the SYN-ACK after 230 s, but no longer after
    270 s (4 min + margin)."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "S", seq=1000))
    s.add(T0 + delay, "outside", tcp_in(SRV1, 80, POOL1, 40000, "SA", seq=5000, ack=1001))
    outs, _ = s.run()
    syn = one(outs, "outside", tcp_seq(1000, "S")).pkt
    assert (syn[IP].src, syn[TCP].sport) == (POOL1, 40000)
    got = pick(outs, "inside", tcp_seq(5000, "SA"))
    if forwarded:
        assert len(got) == 1, f"SYN-ACK after {delay} s must pass\n{h.dump(outs)}"
        assert (got[0].pkt[IP].dst, got[0].pkt[TCP].dport) == (SUB_A, 40000)
    else:
        assert not got, f"SYN-ACK after {delay} s (transitory expired) must not pass\n{h.dump(outs)}"


def test_tcp_rst_does_not_delete_session_immediately(replay):
    """RFC 7857 sec 2.2: on a TCP RST the NAT SHOULD NOT delete the session
    immediately but wait for the transitory (4 min) timeout: packets of the
    connection arriving shortly after the RST are still translated."""
    s = h.Scenario(replay, h.make_config())
    _establish(s)
    s.add(T0 + 100, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "R", seq=1001))
    s.add(T0 + 101, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5001, ack=1001, payload=b"after-rst"))
    outs, _ = s.run()
    r = one(outs, "outside", tcp_seq(1001, "R"), "translated RST").pkt
    assert (r[IP].src, r[TCP].sport) == (POOL1, 40000)
    p = one(outs, "inside", h.has_payload(b"after-rst"), "segment 1 s after RST").pkt
    assert (p[IP].dst, p[TCP].dport) == (SUB_A, 40000)


def test_tcp_rst_session_removed_after_transitory(replay):
    """RFC 7857 sec 2.2: after an RST the NAT waits 4 minutes and then deletes
    the session if no packets were received meanwhile: a segment 300 s after the
    RST is no longer translated."""
    s = h.Scenario(replay, h.make_config())
    _establish(s)
    s.add(T0 + 100, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "R", seq=1001))
    s.add(T0 + 400, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5001, ack=1001, payload=b"way-after-rst"))
    outs, _ = s.run()
    none_of(outs, "inside", h.has_payload(b"way-after-rst"), "segment 300 s after RST")


def test_tcp_connection_that_goes_on_after_an_ignored_rst_keeps_its_session(replay):
    """RFC 7857 sec 2.2: after an RST the NAT deletes the session after 4
    minutes only "if no packets are received during that 4-minute timeout".
    An off-path RST the server ignores (out of window; RFC 5961 makes the
    receiver answer with an ACK) is followed by segments both ways: the
    connection is alive, so an idle hour later it still translates, which a
    session left at the transitory timeout would not."""
    s = h.Scenario(replay, h.make_config())
    _establish(s)
    s.add(T0 + 100, "outside", tcp_in(SRV1, 80, POOL1, 40000, "R", seq=987654))
    s.add(T0 + 100.01, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "A", seq=1001, ack=5001))
    s.add(T0 + 101, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5001, ack=1001, payload=b"still-here"))
    s.add(T0 + 101.01, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "A", seq=1001, ack=5011))
    s.add(T0 + 3700, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5011, ack=1001, payload=b"an-hour-on"))
    outs, _ = s.run()
    one(outs, "inside", h.has_payload(b"still-here"), "segment after the RST")
    p = one(outs, "inside", h.has_payload(b"an-hour-on"), "segment an idle hour after the connection went on").pkt
    assert (p[IP].dst, p[TCP].dport) == (SUB_A, 40000)


def test_tcp_reset_connection_answered_with_rsts_is_removed_after_transitory(replay):
    """RFC 7857 sec 2.2 / RFC 793: a host that sent a RST answers the peer's
    segments still in flight with more RSTs. Those segments do not make the
    connection live again: 300 s after the last of them the session is gone."""
    s = h.Scenario(replay, h.make_config())
    _establish(s)
    s.add(T0 + 100, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "R", seq=1001))
    s.add(T0 + 100.01, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5001, ack=1001, payload=b"in-flight"))
    s.add(T0 + 100.02, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "R", seq=1001))
    s.add(T0 + 400.1, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5010, ack=1001, payload=b"way-after"))
    outs, _ = s.run()
    one(outs, "inside", h.has_payload(b"in-flight"), "segment in flight when the RST left")
    none_of(outs, "inside", h.has_payload(b"way-after"), "segment 300 s after the last RST")


def test_tcp_connection_aborted_after_an_ignored_rst_is_removed_after_transitory(replay):
    """RFC 7857 sec 2.2 / RFC 5961: an off-path RST the host ignores (it
    answers with a challenge ACK), then the host aborting the connection
    with its own RST: only segments after that last RST show whether the
    connection goes on, so the peer's data in flight does not bring the
    session back, and 300 s after it the session is gone."""
    s = h.Scenario(replay, h.make_config())
    _establish(s)
    s.add(T0 + 100, "outside", tcp_in(SRV1, 80, POOL1, 40000, "R", seq=987654))
    s.add(T0 + 100.01, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "A", seq=1001, ack=5001))
    s.add(T0 + 100.02, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "R", seq=1001))
    s.add(T0 + 100.03, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5001, ack=1001, payload=b"in-flight"))
    s.add(T0 + 400.1, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5010, ack=1001, payload=b"way-after"))
    outs, _ = s.run()
    one(outs, "inside", h.has_payload(b"in-flight"), "segment in flight when the host aborted")
    none_of(outs, "inside", h.has_payload(b"way-after"), "segment 300 s after the last RST")


def test_tcp_fin_closed_session_removed_after_transitory(replay):
    """RFC 5382 REQ-5 / RFC 7857 sec 2.2: once both FINs were seen the session is
    transitory; after the 4 min transitory timeout a late segment is dropped."""
    s = h.Scenario(replay, h.make_config())
    _establish(s)
    s.add(T0 + 1, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "FA", seq=1001, ack=5001))
    s.add(T0 + 1.1, "outside", tcp_in(SRV1, 80, POOL1, 40000, "FA", seq=5001, ack=1002))
    s.add(T0 + 1.2, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "A", seq=1002, ack=5002))
    s.add(T0 + 600, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5002, ack=1002, payload=b"zombie"))
    outs, _ = s.run()
    one(outs, "inside", tcp_seq(5001, "FA"))
    none_of(outs, "inside", h.has_payload(b"zombie"), "segment 10 min after the FIN exchange")
