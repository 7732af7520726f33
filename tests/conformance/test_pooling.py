"""Address pooling and port allocation (RFC 4787 REQ-2, RFC 6888, RFC 7422-style blocks)."""

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, POOL1, POOL28, SRV1, SRV2, SRV3, T0, TCP, UDP, echo_out, echo_with, has_payload, in_net, one,
    tcp_out, udp_in, udp_out,
)


def test_paired_pooling_all_protocols(replay):
    """RFC 4787 REQ-2 (IP address pooling behaviour "Paired" RECOMMENDED) and
    contract: a subscriber uses one external address for all its flows, TCP,
    UDP and ICMP alike, even with a /28 pool to choose from."""
    subs = [f"100.64.0.{20 + i}" for i in range(6)]
    s = h.Scenario(replay, h.make_config(pool=[POOL28]))
    t = T0
    for i, sub in enumerate(subs):
        s.add(t, "inside", udp_out(sub, 40000, SRV1, 53, b"u1-%d" % i)); t += 0.01
        s.add(t, "inside", tcp_out(sub, 41000, SRV2, 80, "S", seq=10000 + i)); t += 0.01
        s.add(t, "inside", echo_out(sub, SRV1, 0x100 + i, seq=500 + i)); t += 0.01
        s.add(t, "inside", udp_out(sub, 40001, SRV3, 123, b"u2-%d" % i)); t += 0.01
        s.add(t, "inside", tcp_out(sub, 41001, SRV3, 443, "S", seq=20000 + i)); t += 0.01
    outs, _ = s.run()
    for i, sub in enumerate(subs):
        addrs = {
            one(outs, "outside", has_payload(b"u1-%d" % i)).pkt[IP].src,
            one(outs, "outside", h.tcp_seq(10000 + i, "S")).pkt[IP].src,
            one(outs, "outside", echo_with(8, 500 + i)).pkt[IP].src,
            one(outs, "outside", has_payload(b"u2-%d" % i)).pkt[IP].src,
            one(outs, "outside", h.tcp_seq(20000 + i, "S")).pkt[IP].src,
        }
        assert len(addrs) == 1, f"subscriber {sub} uses several external addresses: {addrs}"
        assert in_net(addrs.pop(), POOL28)


def test_non_contiguous_pool(replay):
    """RFC 6888 REQ-1: the pool may be made of non-contiguous ranges; both
    ranges are used (2 ports per address force it) and return traffic to each
    is translated back."""
    pool = [POOL1 + "/32", "192.0.2.200/32"]
    subs = [f"100.64.0.{30 + i}" for i in range(4)]
    s = h.Scenario(replay, h.make_config(pool=pool, nat={"ports": "5000-5001", "port_parity": False}))
    for i, sub in enumerate(subs):
        s.add(T0 + i * 0.1, "inside", udp_out(sub, 40000 + i, SRV1, 53, b"nc%d" % i))
    outs, _ = s.run()
    ext = {}
    for i, sub in enumerate(subs):
        p = one(outs, "outside", has_payload(b"nc%d" % i)).pkt
        assert p[IP].src in (POOL1, "192.0.2.200")
        assert p[UDP].sport in (5000, 5001)
        ext[sub] = (p[IP].src, p[UDP].sport)
    assert len(set(ext.values())) == 4
    assert {a for a, _ in ext.values()} == {POOL1, "192.0.2.200"}
    for i, sub in enumerate(subs):
        s.add(T0 + 1 + i * 0.1, "outside", udp_in(SRV1, 53, ext[sub][0], ext[sub][1], b"back%d" % i))
    outs, _ = s.run()
    for i, sub in enumerate(subs):
        p = one(outs, "inside", has_payload(b"back%d" % i)).pkt
        assert (p[IP].dst, p[UDP].dport) == (sub, 40000 + i)


def test_port_block_allocation(replay):
    """RFC 6888 sec 5 / RFC 7422 (port set / bulk allocation; contract
    port_block_size): with port_block_size = 64 every external port of a
    subscriber lies in one block of 64 consecutive ports aligned from the start
    of the port range; different subscribers get different blocks."""
    cfg = h.make_config(pool=[POOL1 + "/32"], nat={"port_block_size": 64})
    s = h.Scenario(replay, cfg)
    a, b = "100.64.0.40", "100.64.0.41"
    a_sports = [40000, 40001, 12345, 5000, 60000, 1500, 33333, 44444]
    for i, sp in enumerate(a_sports):
        s.add(T0 + i * 0.01, "inside", udp_out(a, sp, SRV1, 53, b"a%d" % i))
    s.add(T0 + 0.5, "inside", tcp_out(a, 40000, SRV1, 80, "S", seq=777))
    for i, sp in enumerate([40000, 40001, 2000, 2001]):
        s.add(T0 + 1 + i * 0.01, "inside", udp_out(b, sp, SRV1, 53, b"b%d" % i))
    outs, _ = s.run()

    def block(p):
        return (p - 1024) // 64

    a_ports = [one(outs, "outside", has_payload(b"a%d" % i)).pkt[UDP].sport for i in range(len(a_sports))]
    a_ports.append(one(outs, "outside", h.tcp_seq(777, "S")).pkt[TCP].sport)
    b_ports = [one(outs, "outside", has_payload(b"b%d" % i)).pkt[UDP].sport for i in range(4)]
    assert all(1024 <= p <= 65535 for p in a_ports + b_ports)
    assert len({block(p) for p in a_ports}) == 1, f"subscriber A ports span several blocks: {a_ports}"
    assert len({block(p) for p in b_ports}) == 1, f"subscriber B ports span several blocks: {b_ports}"
    assert block(a_ports[0]) != block(b_ports[0]), "two subscribers share one port block"
    assert len(set(a_ports[:-1])) == len(a_sports), "duplicate UDP external ports"
