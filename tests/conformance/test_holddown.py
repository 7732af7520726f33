"""Port hold-down after release (RFC 6888 REQ-8, contract hold_down)."""

import natrix_harness as h
from natrix_harness import (
    IP, POOL1, SRV1, SUB_A, SUB_B, SUB_C, SUB_D, T0, TCP, UDP, has_payload, none_of, one, pick, tcp_in, tcp_out,
    udp_in, udp_out,
)

# One address, two ports; parity off so that the only other port is usable.
CFG = h.make_config(pool=[POOL1 + "/32"], nat={"ports": "5000-5001", "port_parity": False, "hold_down": "120s"},
                    timeouts={"udp": "2m"})


def test_udp_port_hold_down(replay):
    """RFC 6888 REQ-8: once an external port is deallocated it SHOULD NOT be
    reallocated to a new mapping until at least 120 s have passed. A's UDP
    mapping on 5000 expires at T0+120 (udp = 2m); B (T0+121) must not get 5000,
    C (T0+130) finds both ports unusable and is dropped; D (T0+300, after
    expiry + hold_down) may get 5000 again."""
    s = h.Scenario(replay, CFG)
    s.add(T0, "inside", udp_out(SUB_A, 5000, SRV1, 53, b"A"))
    s.add(T0 + 119, "outside", udp_in(SRV1, 53, POOL1, 5000, b"to-A-alive"))
    s.add(T0 + 121, "inside", udp_out(SUB_B, 5000, SRV1, 53, b"B"))
    s.add(T0 + 125, "outside", udp_in(SRV1, 53, POOL1, 5000, b"to-A-expired"))
    s.add(T0 + 130, "inside", udp_out(SUB_C, 5000, SRV1, 53, b"C"))
    s.add(T0 + 300, "inside", udp_out(SUB_D, 5000, SRV1, 53, b"D"))
    outs, rep = s.run()
    a = one(outs, "outside", has_payload(b"A")).pkt
    assert (a[IP].src, a[UDP].sport) == (POOL1, 5000)
    one(outs, "inside", has_payload(b"to-A-alive"), "reply before expiry")
    none_of(outs, "inside", has_payload(b"to-A-expired"), "reply to an expired mapping")
    b = one(outs, "outside", has_payload(b"B")).pkt
    assert b[UDP].sport != 5000, "port 5000 reused within the hold-down period"
    assert b[UDP].sport == 5001
    none_of(outs, "outside", has_payload(b"C"), "datagram for which no port is available")
    d = one(outs, "outside", has_payload(b"D")).pkt
    assert (d[IP].src, d[UDP].sport) == (POOL1, 5000), "port 5000 not reusable after hold-down"


def _tcp_close_scenario(s, how):
    s.add(T0, "inside", tcp_out(SUB_A, 5000, SRV1, 80, "S", seq=100))
    s.add(T0 + 0.1, "outside", tcp_in(SRV1, 80, POOL1, 5000, "SA", seq=900, ack=101))
    s.add(T0 + 0.2, "inside", tcp_out(SUB_A, 5000, SRV1, 80, "A", seq=101, ack=901))
    if how == "fin":
        s.add(T0 + 1.0, "inside", tcp_out(SUB_A, 5000, SRV1, 80, "FA", seq=101, ack=901))
        s.add(T0 + 1.1, "outside", tcp_in(SRV1, 80, POOL1, 5000, "FA", seq=901, ack=102))
        s.add(T0 + 1.2, "inside", tcp_out(SUB_A, 5000, SRV1, 80, "A", seq=102, ack=902))
    elif how == "rst":
        s.add(T0 + 1.0, "inside", tcp_out(SUB_A, 5000, SRV1, 80, "R", seq=101))


def test_tcp_port_closed_by_fin_exempt_from_hold_down(replay):
    """RFC 6888 REQ-8 exception: "If the CGN tracks TCP sessions, TCP ports MAY be
    reused immediately" (contract: a TCP port whose last session closed by an
    observed FIN exchange is exempt). After the FIN exchange and the transitory
    timeout (4m), a new subscriber at T0+260 gets port 5000 although a non-exempt
    port released then would still be held down until ~T0+361."""
    s = h.Scenario(replay, CFG)
    _tcp_close_scenario(s, "fin")
    s.add(T0 + 260, "inside", tcp_out(SUB_B, 5000, SRV1, 80, "S", seq=300))
    outs, _ = s.run()
    a = one(outs, "outside", h.tcp_seq(100, "S")).pkt
    assert (a[IP].src, a[TCP].sport) == (POOL1, 5000)
    assert len(pick(outs, "outside", lambda p: h.is_tcp(p) and p[TCP].sport == 5000 and p[TCP].seq in (101, 102))) == 3
    b = one(outs, "outside", h.tcp_seq(300, "S"), "new SYN from B").pkt
    assert (b[IP].src, b[TCP].sport) == (POOL1, 5000), "FIN-closed TCP port was held down"


def test_tcp_port_closed_by_rst_exempt_from_hold_down(replay):
    """RFC 6888 REQ-8 exception (contract: TCP port whose last session closed by
    an RST is exempt from hold-down): after RST and the 4 min transitory
    period, port 5000 is immediately reusable at T0+260."""
    s = h.Scenario(replay, CFG)
    _tcp_close_scenario(s, "rst")
    s.add(T0 + 260, "inside", tcp_out(SUB_B, 5000, SRV1, 80, "S", seq=300))
    outs, _ = s.run()
    b = one(outs, "outside", h.tcp_seq(300, "S"), "new SYN from B").pkt
    assert (b[IP].src, b[TCP].sport) == (POOL1, 5000), "RST-closed TCP port was held down"


def test_tcp_port_released_by_timeout_is_held_down(replay):
    """RFC 6888 REQ-8 (contrast): a TCP port whose session merely timed out (SYN
    only, transitory 4 min, released at ~T0+240) is not exempt: at T0+260 the
    port is still held down and B gets the other port."""
    s = h.Scenario(replay, CFG)
    s.add(T0, "inside", tcp_out(SUB_A, 5000, SRV1, 80, "S", seq=100))
    s.add(T0 + 260, "inside", tcp_out(SUB_B, 5000, SRV1, 80, "S", seq=300))
    outs, _ = s.run()
    a = one(outs, "outside", h.tcp_seq(100, "S")).pkt
    assert a[TCP].sport == 5000
    b = one(outs, "outside", h.tcp_seq(300, "S"), "new SYN from B").pkt
    assert b[TCP].sport == 5001, "timed-out TCP port reused within hold-down"


def test_port_block_hold_down(replay):
    """Issue #3 / RFC 6888 REQ-8 with bulk allocation: "a released external
    port or block is not handed out again for 120 s". Two blocks of 8
    (ports 5000-5015): A's block is released when its only mapping expires
    (T0+120, udp = 2m); B (T0+130) gets the other block; C (T0+140) finds no
    block it may use and is dropped (pool_exhausted); D (T0+300, after the
    hold-down) gets A's old block."""
    cfg = h.make_config(pool=[POOL1 + "/32"], nat={"ports": "5000-5015", "port_parity": False,
                                                   "port_block_size": 8, "exhaustion_icmp": "none"},
                        timeouts={"udp": "2m"})
    frames = [(T0, "inside", udp_out(SUB_A, 1111, SRV1, 53, b"A")),
              (T0 + 130, "inside", udp_out(SUB_B, 1111, SRV1, 53, b"B")),
              (T0 + 140, "inside", udp_out(SUB_C, 1111, SRV1, 53, b"C")),
              (T0 + 300, "inside", udp_out(SUB_D, 1111, SRV1, 53, b"D"))]
    outs, rep = replay(cfg, frames)

    def blk(tag):
        return (one(outs, "outside", has_payload(tag)).pkt[UDP].sport - 5000) // 8

    a, b, d = blk(b"A"), blk(b"B"), blk(b"D")
    assert b != a, "a released block was handed out within the hold-down time"
    none_of(outs, "outside", has_payload(b"C"), "mapping while both blocks are in use or held down")
    assert d == a, "the held-down block was not reusable after the hold-down time"
    assert rep["drops"] == {"pool_exhausted": 1}, rep["drops"]
