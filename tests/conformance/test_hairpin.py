"""Hairpinning (RFC 4787 REQ-9, RFC 5382 REQ-8, RFC 5508 REQ-7)."""

import natrix_harness as h
from natrix_harness import (
    IP, POOL1, SRV1, SUB_A, SUB_B, T0, TCP, UDP, eth_in, has_payload, icmp_error, icmp_info, ip_bytes, none_of,
    one, pick, tcp_out, tcp_seq, udp_out,
)


def test_udp_hairpin(replay):
    """RFC 4787 REQ-9: a NAT MUST support hairpinning, with behaviour "External
    source IP address and port": A sending to B's external address:port reaches B
    on the inside with A's *external* address:port as source; B's answer to that
    address reaches A with B's external address:port as source. A's hairpin
    mapping is the same one A uses towards the Internet (REQ-1)."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", udp_out(SUB_B, 50000, SRV1, 3478, b"b-registers"))
    outs, _ = s.run()
    bo = one(outs, "outside", has_payload(b"b-registers")).pkt
    b_ext = (bo[IP].src, bo[UDP].sport)
    s.add(T0 + 1, "inside", udp_out(SUB_A, 40000, b_ext[0], b_ext[1], b"a-to-b"))
    outs, _ = s.run()
    hp = one(outs, "inside", has_payload(b"a-to-b"), "hairpinned datagram")
    none_of(outs, "outside", has_payload(b"a-to-b"), "hairpinned datagram on the outside")
    p = hp.pkt
    assert (p[IP].dst, p[UDP].dport) == (SUB_B, 50000)
    assert p[IP].src == POOL1, f"hairpin source {p[IP].src} is not A's external address"
    a_ext = (p[IP].src, p[UDP].sport)
    assert p[IP].ttl == 63, "a hairpinned frame is forwarded once: TTL - 1 (contract)"
    # B answers A's external endpoint; A later talks to the Internet with the same mapping
    s.add(T0 + 2, "inside", udp_out(SUB_B, 50000, a_ext[0], a_ext[1], b"b-to-a"))
    s.add(T0 + 3, "inside", udp_out(SUB_A, 40000, SRV1, 3478, b"a-to-internet"))
    outs, _ = s.run()
    p = one(outs, "inside", has_payload(b"b-to-a"), "hairpinned answer").pkt
    assert (p[IP].dst, p[UDP].dport) == (SUB_A, 40000)
    assert (p[IP].src, p[UDP].sport) == b_ext
    q = one(outs, "outside", has_payload(b"a-to-internet")).pkt
    assert (q[IP].src, q[UDP].sport) == a_ext, "hairpin used a different mapping than A's EIM mapping"


def test_tcp_hairpin(replay):
    """RFC 5382 REQ-8: a NAT MUST support hairpinning for TCP with external
    source IP address and port: A's SYN to B's external endpoint arrives at B
    from A's external endpoint, B's SYN-ACK arrives at A from B's external
    endpoint."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", tcp_out(SUB_B, 50001, SRV1, 80, "S", seq=100))
    outs, _ = s.run()
    bo = one(outs, "outside", tcp_seq(100, "S")).pkt
    b_ext = (bo[IP].src, bo[TCP].sport)
    s.add(T0 + 1, "inside", tcp_out(SUB_A, 40000, b_ext[0], b_ext[1], "S", seq=200))
    outs, _ = s.run()
    p = one(outs, "inside", tcp_seq(200, "S"), "hairpinned SYN").pkt
    assert (p[IP].dst, p[TCP].dport) == (SUB_B, 50001)
    assert p[IP].src == POOL1
    a_ext = (p[IP].src, p[TCP].sport)
    s.add(T0 + 1.1, "inside", tcp_out(SUB_B, 50001, a_ext[0], a_ext[1], "SA", seq=300, ack=201))
    s.add(T0 + 1.2, "inside", tcp_out(SUB_A, 40000, b_ext[0], b_ext[1], "A", seq=201, ack=301))
    outs, _ = s.run()
    p = one(outs, "inside", tcp_seq(300, "SA"), "hairpinned SYN-ACK").pkt
    assert (p[IP].dst, p[TCP].dport) == (SUB_A, 40000)
    assert (p[IP].src, p[TCP].sport) == b_ext
    p = one(outs, "inside", tcp_seq(201, "A"), "hairpinned ACK").pkt
    assert (p[IP].dst, p[TCP].dport, p[IP].src, p[TCP].sport) == (SUB_B, 50001) + a_ext
    none_of(outs, "outside", lambda q: h.is_tcp(q) and q[TCP].seq in (200, 300, 201), "hairpinned segment outside")


def test_icmp_error_hairpin(replay):
    """RFC 5508 REQ-7 (hairpinned ICMP error messages MUST be supported; contract
    "ICMP errors hairpin too"): B answers a hairpinned datagram from A with a
    port unreachable; A receives it with outer source = B's external address and
    the embedded packet restored to A's own (internal) view: source A:40000,
    destination B's external address:port."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", udp_out(SUB_B, 50000, SRV1, 3478, b"b-registers"))
    outs, _ = s.run()
    bo = one(outs, "outside", has_payload(b"b-registers")).pkt
    b_ext = (bo[IP].src, bo[UDP].sport)
    s.add(T0 + 1, "inside", udp_out(SUB_A, 40000, b_ext[0], b_ext[1], b"a-to-b"))
    outs, _ = s.run()
    got = one(outs, "inside", has_payload(b"a-to-b")).pkt
    a_ext = (got[IP].src, got[UDP].sport)
    s.add(T0 + 2, "inside", icmp_error(eth_in(SUB_B), SUB_B, a_ext[0], ip_bytes(got), 3, 3))
    outs, _ = s.run()
    errs = pick(outs, None, h.is_icmp_error)
    assert len(errs) == 1, h.dump(outs)
    e = errs[0]
    assert e.side == "inside"
    t, c, emb = icmp_info(e.pkt)
    assert (t, c) == (3, 3)
    assert e.pkt[IP].dst == SUB_A
    assert e.pkt[IP].src == b_ext[0], "outer source must be B's external address"
    assert (emb.src, emb.sport) == (SUB_A, 40000)
    assert (emb.dst, emb.dport) == b_ext
    assert emb.header_checksum_ok
    assert emb.complete and emb.transport_checksum_ok()
