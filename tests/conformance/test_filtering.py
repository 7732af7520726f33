"""Inbound filtering behaviour (RFC 4787 sec 5 / REQ-8, RFC 5382 REQ-3)."""

import pytest

import natrix_harness as h
from natrix_harness import (
    IP, POOL1, SRV1, SRV2, SUB_A, T0, TCP, UDP, has_payload, none_of, one, pick, tcp_in, tcp_out, udp_in, udp_out,
)

# (label, source, sport, at) and whether each filtering mode lets it through.
PROBES = [
    ("same-endpoint", SRV1, 5000, T0 + 1),
    ("same-addr-other-port", SRV1, 6000, T0 + 2),
    ("other-host", SRV2, 5000, T0 + 3),
    # the subscriber now sends to SRV2:5000 (at T0 + 4)
    ("other-host-after-send", SRV2, 5000, T0 + 5),
    ("other-host-other-port-after-send", SRV2, 6000, T0 + 6),
]
ALLOWED = {
    "endpoint-independent": {p[0] for p in PROBES},
    "address-dependent": {"same-endpoint", "same-addr-other-port", "other-host-after-send",
                          "other-host-other-port-after-send"},
    "address-and-port-dependent": {"same-endpoint", "other-host-after-send"},
}


@pytest.mark.parametrize("mode", [None, "endpoint-independent", "address-dependent", "address-and-port-dependent"])
def test_udp_filtering(replay, mode):
    """RFC 4787 sec 5: Endpoint-Independent Filtering admits packets from any
    external endpoint to an existing mapping (the default, REQ-8 recommended for
    transparency); Address-Dependent Filtering admits only hosts the internal
    endpoint has sent to (any port); Address and Port-Dependent Filtering only the
    exact address:port sent to. Filtered packets are dropped (reason filtered)."""
    nat = {} if mode is None else {"filtering": mode}
    effective = mode or "endpoint-independent"
    s = h.Scenario(replay, h.make_config(nat=nat))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 5000, b"first-out"))
    for label, src, sport, at in PROBES[:3]:
        s.add(at, "outside", udp_in(src, sport, POOL1, 40000, label.encode()))
    s.add(T0 + 4, "inside", udp_out(SUB_A, 40000, SRV2, 5000, b"second-out"))
    for label, src, sport, at in PROBES[3:]:
        s.add(at, "outside", udp_in(src, sport, POOL1, 40000, label.encode()))
    outs, rep = s.run()
    o = one(outs, "outside", has_payload(b"first-out")).pkt
    assert (o[IP].src, o[UDP].sport) == (POOL1, 40000)
    one(outs, "outside", has_payload(b"second-out"))
    denied = 0
    for label, src, sport, _ in PROBES:
        got = pick(outs, "inside", has_payload(label.encode()))
        if label in ALLOWED[effective]:
            assert len(got) == 1, f"{effective}: '{label}' from {src}:{sport} should pass\n{h.dump(outs)}"
            p = got[0].pkt
            assert (p[IP].src, p[UDP].sport, p[IP].dst, p[UDP].dport) == (src, sport, SUB_A, 40000)
        else:
            denied += 1
            assert not got, f"{effective}: '{label}' from {src}:{sport} must be filtered\n{h.dump(outs)}"
    assert rep["drops"].get("filtered", 0) == denied, rep["drops"]


@pytest.mark.parametrize("mode,allowed", [("endpoint-independent", True), ("address-dependent", False),
                                          ("address-and-port-dependent", False)])
def test_tcp_filtering_other_host(replay, mode, allowed):
    """RFC 5382 REQ-3: with Endpoint-Independent Filtering a SYN from any host to
    an existing TCP mapping is admitted (simultaneous-open style, contract); with
    Address-Dependent or Address-and-Port-Dependent filtering a host the
    subscriber never contacted is not admitted."""
    s = h.Scenario(replay, h.make_config(nat={"filtering": mode}))
    s.add(T0, "inside", tcp_out(SUB_A, 40000, SRV1, 80, "S", seq=100))
    s.add(T0 + 0.5, "outside", tcp_in(SRV2, 7777, POOL1, 40000, "S", seq=900))
    s.add(T0 + 0.6, "outside", tcp_in(SRV1, 80, POOL1, 40000, "SA", seq=500, ack=101))
    outs, _ = s.run()
    o = one(outs, "outside", h.tcp_seq(100, "S")).pkt
    assert (o[IP].src, o[TCP].sport) == (POOL1, 40000)
    one(outs, "inside", h.tcp_seq(500, "SA"), "SYN-ACK from the contacted server")
    got = pick(outs, "inside", h.tcp_seq(900))
    if allowed:
        assert len(got) == 1, h.dump(outs)
        assert (got[0].pkt[IP].dst, got[0].pkt[TCP].dport) == (SUB_A, 40000)
    else:
        assert not got, f"{mode}: SYN from an uncontacted host must not be forwarded\n{h.dump(outs)}"


@pytest.mark.parametrize("mode", ["address-dependent", "address-and-port-dependent"])
def test_simultaneous_open_through_restrictive_filtering(replay, mode):
    """RFC 5382 REQ-2 / contract: an inbound SYN that matches an existing TCP
    mapping and passes filtering is forwarded (simultaneous open, hole
    punching): with address(-and-port)-dependent filtering, the SYN from the
    very endpoint the subscriber sent its SYN to passes; no ICMP is sent."""
    s = h.Scenario(replay, h.make_config(nat={"filtering": mode}))
    s.add(T0, "inside", tcp_out(SUB_A, 40000, SRV1, 5555, "S", seq=8000))
    s.add(T0 + 0.5, "outside", tcp_in(SRV1, 5555, POOL1, 40000, "S", seq=7000))
    s.add(T0 + 10, "inside", udp_out(SUB_A, 40100, SRV2, 53, b"time-passes"))
    outs, rep = s.run()
    assert one(outs, "outside", h.tcp_seq(8000, "S")).pkt[TCP].sport == 40000
    p = one(outs, "inside", h.tcp_seq(7000, "S"), "peer's SYN").pkt
    assert (p[IP].dst, p[TCP].dport) == (SUB_A, 40000)
    none_of(outs, None, h.is_icmp, "ICMP")
    assert rep["drops"] == {}, rep["drops"]
