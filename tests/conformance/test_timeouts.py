"""Session and mapping timers driven by capture timestamps (RFC 5382 REQ-5,
RFC 7857 sec 2.2, RFC 4787 REQ-5/REQ-6, RFC 5508 REQ-2; contract [timeouts]
and inbound_refresh).

Each test batches independent flows (distinct source ports) into one replay:
one flow probes just before the timeout, another just after."""

import pytest

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, POOL1, SRV1, SUB_A, SUB_B, T0, TCP, UDP, echo_out, echo_reply_in, echo_with, has_payload, none_of,
    one, tcp_in, tcp_out, udp_in, udp_out,
)


def _established(frames, port, t):
    """Three-way handshake SUB_A:port <-> SRV1:80 starting at t; returns the
    time of its last packet."""
    frames.append((t, "inside", tcp_out(SUB_A, port, SRV1, 80, "S", seq=1000)))
    frames.append((t + 0.01, "outside", tcp_in(SRV1, 80, POOL1, port, "SA", seq=5000, ack=1001)))
    frames.append((t + 0.02, "inside", tcp_out(SUB_A, port, SRV1, 80, "A", seq=1001, ack=5001)))
    return t + 0.02


def _probe(frames, port, at, tag):
    frames.append((at, "outside", tcp_in(SRV1, 80, POOL1, port, "PA", seq=5001, ack=1001, payload=tag)))


@pytest.mark.parametrize("timeout,seconds", [(None, 7440), ("2h10m", 7800)])
def test_tcp_established_idle_timeout_removes_mapping(replay, timeout, seconds):
    """RFC 5382 REQ-5: the established idle-timeout is at least 2 h 4 min
    (default) and configurable (contract tcp_established); past it the
    session and mapping are gone, so inbound data is dropped (no_mapping); just
    before it, data still passes."""
    cfg = h.make_config(timeouts={"tcp_established": timeout} if timeout else None)
    frames = []
    last1 = _established(frames, 40000, T0)
    last2 = _established(frames, 40002, T0 + 1)
    _probe(frames, 40000, last1 + seconds - 15, b"before")
    _probe(frames, 40002, last2 + seconds + 15, b"after")
    frames.sort(key=lambda f: f[0])
    outs, rep = replay(cfg, frames)
    p = one(outs, "inside", has_payload(b"before"), "data 15 s before the idle timeout").pkt
    assert (p[IP].dst, p[TCP].dport) == (SUB_A, 40000)
    none_of(outs, "inside", has_payload(b"after"), "data 15 s after the idle timeout")
    assert rep["drops"] == {"no_mapping": 1}, rep["drops"]


def _fin_close(frames, port, t):
    t = _established(frames, port, t)
    frames.append((t + 1, "inside", tcp_out(SUB_A, port, SRV1, 80, "FA", seq=1001, ack=5001)))
    frames.append((t + 1.01, "outside", tcp_in(SRV1, 80, POOL1, port, "FA", seq=5001, ack=1002)))
    frames.append((t + 1.02, "inside", tcp_out(SUB_A, port, SRV1, 80, "A", seq=1002, ack=5002)))
    return t + 1.02


def _rst_close(frames, port, t, from_inside=True):
    t = _established(frames, port, t)
    if from_inside:
        frames.append((t + 1, "inside", tcp_out(SUB_A, port, SRV1, 80, "R", seq=1001)))
    else:
        frames.append((t + 1, "outside", tcp_in(SRV1, 80, POOL1, port, "R", seq=5001)))
    return t + 1


@pytest.mark.parametrize("timeout,seconds", [(None, 240), ("6m", 360)])
def test_tcp_transitory_timeout_after_fin_and_rst(replay, timeout, seconds):
    """RFC 5382 REQ-5 and RFC 7857 sec 2.2: after a FIN exchange, or an RST
    (from either side), the session is transitory: it is not deleted at once
    (RFC 7857: a RST moves it to the transitory timer) but disappears once the
    transitory idle-timeout (default 4 min, contract tcp_transitory) has
    passed. Probes 10 s before the timeout pass, probes 10 s after are dropped
    although the established timeout (2h4m) is far away."""
    cfg = h.make_config(timeouts={"tcp_transitory": timeout} if timeout else None)
    frames = []
    closers = [("fin", _fin_close, {}), ("rst-in", _rst_close, {}), ("rst-out", _rst_close, {"from_inside": False})]
    port = 40000
    expect_pass, expect_drop = [], []
    for i, (name, close, kw) in enumerate(closers):
        for j, (delta, ok) in enumerate([(-10, True), (10, False)]):
            last = close(frames, port, T0 + i * 10 + j * 5, **kw)
            tag = f"{name}{delta:+d}".encode()
            frames.append((last + seconds + delta, "outside",
                           tcp_in(SRV1, 80, POOL1, port, "A", seq=5002, ack=1002, payload=tag)))
            (expect_pass if ok else expect_drop).append((tag, port))
            port += 2
    frames.sort(key=lambda f: f[0])
    outs, rep = replay(cfg, frames)
    for tag, port in expect_pass:
        p = one(outs, "inside", has_payload(tag), f"{tag!r} (transitory not yet expired)").pkt
        assert (p[IP].dst, p[TCP].dport) == (SUB_A, port)
    for tag, _ in expect_drop:
        none_of(outs, "inside", has_payload(tag), f"{tag!r} (transitory expired)")
    assert rep["drops"].get("no_mapping", 0) == len(expect_drop), rep["drops"]


def test_tcp_rst_keeps_session_for_late_segments(replay):
    """RFC 7857 sec 2.2: "a NAT ... SHOULD NOT delete the session immediately"
    on RST: segments of the connection seen within the transitory timeout
    (here 2 s and 60 s after an inbound RST) are still translated, in both
    directions, on the same external port."""
    frames = []
    last = _rst_close(frames, 40000, T0, from_inside=False)
    frames.append((last + 2, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "R", seq=1001, payload=b"")))
    frames.append((last + 2.5, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "PA", seq=1001, ack=5001,
                                               payload=b"late-out")))
    frames.append((last + 60, "outside", tcp_in(SRV1, 80, POOL1, 40000, "PA", seq=5001, ack=1009,
                                                payload=b"late-in")))
    outs, _ = replay(h.make_config(), frames)
    one(outs, "inside", h.tcp_seq(5001, "R"), "the RST itself")
    p = one(outs, "outside", has_payload(b"late-out")).pkt
    assert (p[IP].src, p[TCP].sport) == (POOL1, 40000)
    p = one(outs, "inside", has_payload(b"late-in")).pkt
    assert (p[IP].dst, p[TCP].dport) == (SUB_A, 40000)


@pytest.mark.parametrize("timeout,seconds", [(None, 300), ("3m", 180)])
def test_udp_timeout(replay, timeout, seconds):
    """RFC 4787 REQ-5: the UDP mapping timer is at least 2 min, 5 min by default
    (contract udp = "5m"), configurable: a reply 10 s before the timeout
    passes, one 10 s after it is dropped (no_mapping)."""
    cfg = h.make_config(timeouts={"udp": timeout} if timeout else None)
    frames = [
        (T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q1")),
        (T0 + 1, "inside", udp_out(SUB_A, 40002, SRV1, 53, b"q2")),
        (T0 + seconds - 10, "outside", udp_in(SRV1, 53, POOL1, 40000, b"before")),
        (T0 + 1 + seconds + 10, "outside", udp_in(SRV1, 53, POOL1, 40002, b"after")),
    ]
    outs, rep = replay(cfg, frames)
    one(outs, "inside", has_payload(b"before"))
    none_of(outs, "inside", has_payload(b"after"), "reply after the UDP timeout")
    assert rep["drops"] == {"no_mapping": 1}, rep["drops"]


@pytest.mark.parametrize("timeout,seconds", [(None, 60), ("90s", 90)])
def test_icmp_query_timeout(replay, timeout, seconds):
    """RFC 5508 REQ-2: the ICMP query session timer is at least 60 s (contract
    icmp = "60s"), configurable: an echo reply 5 s before the timeout passes,
    one 5 s after is dropped."""
    cfg = h.make_config(timeouts={"icmp": timeout} if timeout else None)
    frames = [
        (T0, "inside", echo_out(SUB_A, SRV1, 0x1001, seq=1)),
        (T0 + 1, "inside", echo_out(SUB_A, SRV1, 0x1002, seq=2)),
    ]
    outs, _ = replay(cfg, frames)
    id1 = one(outs, "outside", echo_with(8, 1)).pkt[ICMP].id
    id2 = one(outs, "outside", echo_with(8, 2)).pkt[ICMP].id
    frames += [
        (T0 + seconds - 5, "outside", echo_reply_in(SRV1, POOL1, id1, seq=1)),
        (T0 + 1 + seconds + 5, "outside", echo_reply_in(SRV1, POOL1, id2, seq=2)),
    ]
    outs, rep = replay(cfg, frames)
    p = one(outs, "inside", echo_with(0, 1), "echo reply before the ICMP timeout").pkt
    assert (p[IP].dst, p[ICMP].id) == (SUB_A, 0x1001)
    none_of(outs, "inside", echo_with(0, 2), "echo reply after the ICMP timeout")
    assert rep["drops"] == {"no_mapping": 1}, rep["drops"]


def test_outbound_refresh_but_no_inbound_refresh(replay):
    """RFC 4787 REQ-6 (outbound refresh MUST be true) with the contract default
    inbound_refresh = false, for UDP and ICMP queries (udp = 2m, icmp = 60s):
    - a flow kept alive only by outbound packets survives well past the timeout
      measured from its first packet;
    - a flow that only receives inbound packets expires at (last outbound +
      timeout) although inbound packets kept arriving."""
    cfg = h.make_config(timeouts={"udp": "2m", "icmp": "60s"})
    frames = []
    # UDP kept alive outbound: out at 0, 100, 200; reply at 300 (< 200+120)
    for k, t in enumerate((0, 100, 200)):
        frames.append((T0 + t, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"keep%d" % k)))
    frames.append((T0 + 300, "outside", udp_in(SRV1, 53, POOL1, 40000, b"keep-reply")))
    # UDP with inbound only: out at 0.5, in at 60, 110, then 125 (> 0.5+120)
    frames.append((T0 + 0.5, "inside", udp_out(SUB_B, 40010, SRV1, 53, b"once")))
    for k, t in enumerate((60, 110, 125)):
        frames.append((T0 + t, "outside", udp_in(SRV1, 53, POOL1, 40010, b"in%d" % k)))
    frames.sort(key=lambda f: f[0])
    outs, rep = replay(cfg, frames)
    one(outs, "inside", has_payload(b"keep-reply"), "reply to an outbound-refreshed mapping")
    one(outs, "inside", has_payload(b"in0"))
    one(outs, "inside", has_payload(b"in1"))
    none_of(outs, "inside", has_payload(b"in2"), "inbound packet after expiry (inbound must not refresh)")

    # ICMP: echo requests at 0 and 40 -> reply at 90 passes (40+60);
    # second identifier: request at 1, replies at 30 and 59 pass, 65 dropped.
    frames = [(T0, "inside", echo_out(SUB_A, SRV1, 0x2001, seq=1)),
              (T0 + 1, "inside", echo_out(SUB_A, SRV1, 0x2002, seq=2)),
              (T0 + 40, "inside", echo_out(SUB_A, SRV1, 0x2001, seq=3))]
    outs, _ = replay(cfg, frames)
    e1 = one(outs, "outside", echo_with(8, 1)).pkt[ICMP].id
    e2 = one(outs, "outside", echo_with(8, 2)).pkt[ICMP].id
    assert one(outs, "outside", echo_with(8, 3)).pkt[ICMP].id == e1
    frames += [(T0 + 90, "outside", echo_reply_in(SRV1, POOL1, e1, seq=3)),
               (T0 + 30, "outside", echo_reply_in(SRV1, POOL1, e2, seq=20)),
               (T0 + 59, "outside", echo_reply_in(SRV1, POOL1, e2, seq=21)),
               (T0 + 65, "outside", echo_reply_in(SRV1, POOL1, e2, seq=22))]
    frames.sort(key=lambda f: f[0])
    outs, _ = replay(cfg, frames)
    one(outs, "inside", echo_with(0, 3), "echo reply after an outbound refresh")
    one(outs, "inside", echo_with(0, 20))
    one(outs, "inside", echo_with(0, 21))
    none_of(outs, "inside", echo_with(0, 22), "echo reply after expiry (inbound must not refresh)")
