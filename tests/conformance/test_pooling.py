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
    """RFC 6888 REQ-3: the pool may be made of non-contiguous ranges; both
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


def greedy_blocks(ports, n):
    """Minimum number of runs of ``n`` consecutive port numbers covering ``ports``
    (greedy interval cover is optimal on a line)."""
    blocks = 0
    end = -1
    for p in sorted(ports):
        if p > end:
            blocks += 1
            end = p + n - 1
    return blocks


def test_greedy_blocks_helper():
    assert greedy_blocks([1, 2, 16], 16) == 1
    assert greedy_blocks([1, 2, 17], 16) == 2
    assert greedy_blocks([5, 100, 101, 300], 8) == 3


def test_port_block_allocation(replay):
    """RFC 6888 sec 5 / RFC 7422 (port sets / bulk port allocation; contract
    port_block_size): with port_block_size = 16 a subscriber receives blocks of
    16 consecutive ports and takes its external ports from them: A's first 12
    UDP mappings fit one block, its next 12 need a second one (never more); B's
    ports come from a block of its own, disjoint from A's ports; all ports are
    distinct, in range and on the single pool address."""
    n = 16
    cfg = h.make_config(pool=[POOL1 + "/32"], nat={"port_block_size": n, "port_parity": False})
    s = h.Scenario(replay, cfg)
    a, b = "100.64.0.40", "100.64.0.41"
    a_sports = [40000 + 7 * i for i in range(24)]
    for i, sp in enumerate(a_sports[:12]):
        s.add(T0 + i * 0.01, "inside", udp_out(a, sp, SRV1, 53, b"a%d" % i))
    for i, sp in enumerate([40000, 40001, 2000, 2001, 1500]):
        s.add(T0 + 1 + i * 0.01, "inside", udp_out(b, sp, SRV1, 53, b"b%d" % i))
    for i, sp in enumerate(a_sports[12:], start=12):
        s.add(T0 + 2 + i * 0.01, "inside", udp_out(a, sp, SRV1, 53, b"a%d" % i))
    outs, rep = s.run()

    def ext(tag):
        p = one(outs, "outside", has_payload(tag)).pkt
        assert p[IP].src == POOL1
        return p[UDP].sport

    a_first = [ext(b"a%d" % i) for i in range(12)]
    a_all = a_first + [ext(b"a%d" % i) for i in range(12, 24)]
    b_ports = [ext(b"b%d" % i) for i in range(5)]
    assert all(1024 <= p <= 65535 for p in a_all + b_ports)
    assert len(set(a_all)) == 24 and len(set(b_ports)) == 5, "an external port was handed out twice"
    assert not set(a_all) & set(b_ports), "two subscribers share an external port"
    assert max(a_first) - min(a_first) < n, f"A's first 12 ports are not in one block of {n}: {sorted(a_first)}"
    assert max(b_ports) - min(b_ports) < n, f"B's 5 ports are not in one block of {n}: {sorted(b_ports)}"
    assert greedy_blocks(a_all, n) == 2, f"A's 24 ports do not fit in two blocks of {n}: {sorted(a_all)}"
    lo, hi = min(b_ports), max(b_ports)
    assert not [p for p in a_all if lo <= p <= hi], "A's ports lie inside B's block"
    assert rep["drops"] == {}, rep["drops"]


def test_port_block_quota(replay):
    """RFC 6888 REQ-4 with bulk allocation: the per-subscriber port limit is
    enforced in whole blocks: with port_block_size = 8 and
    max_ports_per_subscriber = 16 a subscriber gets at most two blocks: 16 UDP
    mappings are translated (within two runs of 8 consecutive ports), the 17th
    is dropped as port_quota; another subscriber is unaffected."""
    cfg = h.make_config(pool=[POOL1 + "/32"], nat={"port_block_size": 8, "max_ports_per_subscriber": 16,
                                                   "port_parity": False, "exhaustion_icmp": "none"})
    a, b = "100.64.0.42", "100.64.0.43"
    frames = [(T0 + i * 0.01, "inside", udp_out(a, 30000 + i, SRV1, 53, b"q%d" % i)) for i in range(17)]
    frames.append((T0 + 1, "inside", udp_out(b, 30000, SRV1, 53, b"other")))
    outs, rep = replay(cfg, frames)
    ports = [one(outs, "outside", has_payload(b"q%d" % i)).pkt[UDP].sport for i in range(16)]
    assert len(set(ports)) == 16
    assert greedy_blocks(ports, 8) == 2, f"16 ports not in two blocks of 8: {sorted(ports)}"
    h.none_of(outs, "outside", has_payload(b"q16"), "mapping beyond the block quota")
    o = one(outs, "outside", has_payload(b"other")).pkt
    assert o[UDP].sport not in ports
    assert rep["drops"] == {"port_quota": 1}, rep["drops"]
