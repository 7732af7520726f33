"""Per-subscriber limits (RFC 6888 REQ-3, REQ-4; RFC 5508 / RFC 7857 sec 5 ICMP on exhaustion)."""

import pytest

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, INSIDE_ADDR, POOL1, SRV1, SUB_A, SUB_B, T0, UDP, Ether, has_payload, icmp_info, none_of, one, pick,
    udp_in, udp_out,
)


@pytest.mark.parametrize("mode,code", [(None, 1), ("host-unreachable", 1), ("admin-prohibited", 13), ("none", None)])
def test_per_subscriber_port_limit(replay, mode, code):
    """RFC 6888 REQ-4: a CGN MUST support limiting the number of external ports
    per subscriber; REQ-11 (RFC 6888 sec 3) when it cannot create a mapping it MUST
    drop the packet, SHOULD send ICMP Destination Unreachable code 1 (Host
    Unreachable) to the sender (contract: from the inside address; code 13 with
    "admin-prohibited", nothing with "none"), and MUST NOT delete existing
    mappings to make room. Other subscribers are unaffected."""
    nat = {"max_ports_per_subscriber": 2}
    if mode is not None:
        nat["exhaustion_icmp"] = mode
    s = h.Scenario(replay, h.make_config(nat=nat))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"a1"))
    s.add(T0 + 0.1, "inside", udp_out(SUB_A, 40002, SRV1, 53, b"a2"))
    third = s.add(T0 + 0.2, "inside", udp_out(SUB_A, 40004, SRV1, 53, b"a3-over-quota"))
    s.add(T0 + 0.3, "inside", udp_out(SUB_B, 40004, SRV1, 53, b"b1"))
    s.add(T0 + 0.4, "outside", udp_in(SRV1, 53, POOL1, 40000, b"to-a1"))
    s.add(T0 + 0.5, "outside", udp_in(SRV1, 53, POOL1, 40002, b"to-a2"))
    outs, rep = s.run()
    one(outs, "outside", has_payload(b"a1"))
    one(outs, "outside", has_payload(b"a2"))
    none_of(outs, "outside", has_payload(b"a3-over-quota"), "datagram beyond the port quota")
    b = one(outs, "outside", has_payload(b"b1"), "other subscriber's datagram").pkt
    assert b[IP].src == POOL1
    # existing mappings were not deleted to make room
    assert one(outs, "inside", has_payload(b"to-a1")).pkt[UDP].dport == 40000
    assert one(outs, "inside", has_payload(b"to-a2")).pkt[UDP].dport == 40002
    assert rep["drops"].get("port_quota", 0) == 1, rep["drops"]

    errs = pick(outs, None, h.is_icmp_error)
    if code is None:
        assert not errs, f"exhaustion_icmp = none must not generate ICMP\n{h.dump(outs)}"
        return
    assert len(errs) == 1, h.dump(outs)
    e = errs[0]
    assert e.side == "inside", "the ICMP error must go back to the subscriber"
    t, c, emb = icmp_info(e.pkt)
    assert (t, c) == (3, code)
    assert e.pkt[IP].src == INSIDE_ADDR, f"ICMP error source {e.pkt[IP].src}, contract says the inside address"
    assert e.pkt[IP].dst == SUB_A
    assert abs(e.ts - (T0 + 0.2)) < 1e-3
    # generated frames carry the triggering frame's Ethernet addresses swapped
    assert e.pkt[Ether].src == third[Ether].dst and e.pkt[Ether].dst == third[Ether].src
    assert emb is not None and emb.header_checksum_ok
    assert (emb.src, emb.dst, emb.sport, emb.dport) == (SUB_A, SRV1, 40004, 53)
    assert rep["packets"]["generated"] == 1


def test_per_protocol_port_limit(replay):
    """RFC 6888 REQ-4 b: per-subscriber limits MAY be configurable per transport
    protocol (contract max_ports_per_protocol): with udp = 1, a second UDP port
    is refused while TCP still works."""
    s = h.Scenario(replay, h.make_config(nat={"max_ports_per_protocol": {"tcp": 10, "udp": 1, "icmp": 10}}))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"u1"))
    s.add(T0 + 0.1, "inside", udp_out(SUB_A, 40002, SRV1, 53, b"u2"))
    s.add(T0 + 0.2, "inside", h.tcp_out(SUB_A, 40002, SRV1, 80, "S", seq=42))
    outs, rep = s.run()
    one(outs, "outside", has_payload(b"u1"))
    none_of(outs, "outside", has_payload(b"u2"), "second UDP port beyond the UDP quota")
    one(outs, "outside", h.tcp_seq(42, "S"), "TCP SYN within the TCP quota")
    assert rep["drops"].get("port_quota", 0) == 1, rep["drops"]


def test_session_limit_per_subscriber(replay):
    """RFC 6888 REQ-5: a CGN SHOULD support limiting state per subscriber
    (contract max_sessions_per_subscriber): with a limit of 2 sessions, a third
    destination through the same mapping is dropped (session_quota)."""
    s = h.Scenario(replay, h.make_config(nat={"max_sessions_per_subscriber": 2, "exhaustion_icmp": "none"}))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"s1"))
    s.add(T0 + 0.1, "inside", udp_out(SUB_A, 40000, h.SRV2, 53, b"s2"))
    s.add(T0 + 0.2, "inside", udp_out(SUB_A, 40000, h.SRV3, 53, b"s3"))
    s.add(T0 + 0.3, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"s1-again"))
    outs, rep = s.run()
    one(outs, "outside", has_payload(b"s1"))
    one(outs, "outside", has_payload(b"s2"))
    none_of(outs, "outside", has_payload(b"s3"), "third session beyond the session quota")
    one(outs, "outside", has_payload(b"s1-again"), "packet of an existing session")
    assert rep["drops"].get("session_quota", 0) == 1, rep["drops"]


def test_session_limit_per_mapping_holds_off_remotes_with_endpoint_independent_filtering(replay):
    """RFC 6888 REQ-5 (seed 004): a CGN SHOULD support limiting the state
    memory allocated per mapping as well as per subscriber. With
    endpoint-independent filtering (RFC 4787 REQ-8) any remote's packet to a
    mapping makes a session; with max_sessions_per_mapping = 3 the mapping
    holds its own session and two from remotes, a third remote's is dropped
    (mapping_session_quota), the subscriber's other mapping still opens
    sessions within its per-subscriber limit, and the sessions already there
    keep working."""
    nat = {"filtering": "endpoint-independent", "max_sessions_per_mapping": 3, "max_sessions_per_subscriber": 100, "exhaustion_icmp": "none"}
    s = h.Scenario(replay, h.make_config(nat=nat))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 5000, b"own"))
    s.add(T0 + 0.1, "outside", udp_in(h.SRV2, 6001, POOL1, 40000, b"r1"))
    s.add(T0 + 0.2, "outside", udp_in(h.SRV2, 6002, POOL1, 40000, b"r2"))
    s.add(T0 + 0.3, "outside", udp_in(h.SRV3, 6003, POOL1, 40000, b"r3-over"))
    s.add(T0 + 0.4, "outside", udp_in(h.SRV2, 6001, POOL1, 40000, b"r1-again"))
    s.add(T0 + 0.5, "outside", udp_in(SRV1, 5000, POOL1, 40000, b"own-reply"))
    s.add(T0 + 0.6, "inside", udp_out(SUB_A, 40002, h.SRV3, 5000, b"other-mapping"))
    outs, rep = s.run()
    for p in (b"r1", b"r2", b"r1-again", b"own-reply"):
        assert one(outs, "inside", has_payload(p)).pkt[UDP].dport == 40000
    none_of(outs, "inside", has_payload(b"r3-over"), "a fourth session through the mapping")
    one(outs, "outside", has_payload(b"other-mapping"), "the subscriber's other mapping")
    assert rep["drops"].get("mapping_session_quota", 0) == 1, rep["drops"]


def test_new_mappings_rate_limit(replay):
    """RFC 6888 REQ-5 b ("rate-limit the subscriber's creation of new
    mappings"; contract max_new_mappings_per_second, drop reason
    rate_limited): with a limit of 2 per second, a burst of 6 new mappings in
    50 ms gets at most 2 through (at least 1), the rest are dropped as
    rate_limited; packets of an already created mapping are never limited; two
    seconds later new mappings are allowed again; another subscriber has its
    own budget."""
    s = h.Scenario(replay, h.make_config(nat={"max_new_mappings_per_second": 2, "exhaustion_icmp": "none"}))
    for i in range(6):
        s.add(T0 + i * 0.01, "inside", udp_out(SUB_A, 40000 + 2 * i, SRV1, 53, b"burst%d" % i))
    s.add(T0 + 0.06, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"existing"))
    s.add(T0 + 0.07, "inside", udp_out(SUB_B, 40000, SRV1, 53, b"other-sub"))
    s.add(T0 + 2.5, "inside", udp_out(SUB_A, 41000, SRV1, 53, b"later"))
    outs, rep = s.run()
    passed = [i for i in range(6) if pick(outs, "outside", has_payload(b"burst%d" % i))]
    assert 1 <= len(passed) <= 2, f"{len(passed)} of a burst of 6 new mappings passed a 2/s limit\n{h.dump(outs)}"
    assert passed[0] == 0
    one(outs, "outside", has_payload(b"existing"), "packet of an existing mapping")
    one(outs, "outside", has_payload(b"other-sub"), "another subscriber's first mapping")
    one(outs, "outside", has_payload(b"later"), "new mapping 2.5 s after the burst")
    assert rep["drops"] == {"rate_limited": 6 - len(passed)}, rep["drops"]


def test_exhaustion_icmp_is_rate_limited(replay):
    """Contract icmp_errors_per_second (RFC 6888 REQ-11 / RFC 5508: generated
    ICMP is rate limited): with 2 per second and a port quota of 1, twenty
    refused datagrams within 0.2 s produce at most 2 ICMP errors (at least 1);
    all twenty are dropped as port_quota."""
    nat = {"max_ports_per_subscriber": 1, "icmp_errors_per_second": 2}
    frames = [(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"ok"))]
    frames += [(T0 + 0.01 * (i + 1), "inside", udp_out(SUB_A, 40002 + 2 * i, SRV1, 53, b"no%d" % i))
               for i in range(20)]
    outs, rep = replay(h.make_config(nat=nat), frames)
    one(outs, "outside", has_payload(b"ok"))
    errs = pick(outs, "inside", h.is_icmp_error)
    assert 1 <= len(errs) <= 2, f"{len(errs)} ICMP errors with icmp_errors_per_second = 2\n{h.dump(outs)}"
    assert rep["drops"] == {"port_quota": 20}, rep["drops"]
    assert rep["packets"]["generated"] == len(errs)
