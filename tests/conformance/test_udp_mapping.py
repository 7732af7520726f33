"""UDP translation, mapping and port assignment (RFC 4787, RFC 6888)."""

import pytest

import natrix_harness as h
from natrix_harness import (
    IP, POOL1, POOL28, SRV1, SRV2, SRV3, SUB_A, SUB_B, T0, UDP, Dot1Q, Ether, Raw, Scenario,
    has_payload, in_net, none_of, one, udp_in, udp_out,
)


def assert_eth_kept(out, inpkt):
    """Contract: forwarded frames keep their Ethernet header (and VLAN tags) unchanged."""
    assert out.pkt.original[:12] == bytes(inpkt)[:12], "Ethernet addresses were changed"


def test_udp_outbound_translation_and_reply(replay):
    """RFC 4787 sec 4 (NAPT) / RFC 1812 5.3.1: an outbound UDP datagram leaves
    with its source rewritten to a pool address, the source port preserved when
    free (contract port_selection=preserve), TTL decremented by one and valid
    checksums; the server's reply to that external address:port is translated
    back to the subscriber."""
    s = Scenario(replay, h.make_config(pool=[POOL28]))
    q = s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q1"))
    outs, _ = s.run()
    o = one(outs, "outside", has_payload(b"q1"), "translated UDP datagram")
    ip = o.pkt[IP]
    assert in_net(ip.src, POOL28), f"source {ip.src} not from the pool"
    assert ip.dst == SRV1
    assert o.pkt[UDP].sport == 40000, "source port not preserved although free"
    assert o.pkt[UDP].dport == 53
    assert ip.ttl == 63
    assert abs(o.ts - T0) < 1e-6
    assert_eth_kept(o, q)
    none_of(outs, "inside", lambda p: True, "frame")
    ext = ip.src

    r = s.add(T0 + 0.1, "outside", udp_in(SRV1, 53, ext, 40000, b"r1"))
    outs, _ = s.run()
    o = one(outs, "inside", has_payload(b"r1"), "translated reply")
    assert (o.pkt[IP].src, o.pkt[UDP].sport) == (SRV1, 53)
    assert (o.pkt[IP].dst, o.pkt[UDP].dport) == (SUB_A, 40000)
    assert o.pkt[IP].ttl == 63
    assert_eth_kept(o, r)


def test_udp_zero_checksum_stays_zero(replay):
    """RFC 768 / RFC 3022 sec 4.1: a UDP datagram sent without checksum (0) must
    stay without checksum after translation, in both directions (a NAT must not
    turn 0 into an incremental update of 0)."""
    s = Scenario(replay, h.make_config(pool=[POOL28]))
    s.add(T0, "inside", udp_out(SUB_A, 40002, SRV1, 5000, b"zero-out", chksum=0))
    outs, _ = s.run()
    o = one(outs, "outside", has_payload(b"zero-out"))
    assert o.pkt[UDP].chksum == 0, "outbound zero UDP checksum was changed"
    ext, port = o.pkt[IP].src, o.pkt[UDP].sport
    assert in_net(ext, POOL28), "not translated"
    s.add(T0 + 0.1, "outside", udp_in(SRV1, 5000, ext, port, b"zero-in", chksum=0))
    outs, _ = s.run()
    o = one(outs, "inside", has_payload(b"zero-in"))
    assert o.pkt[UDP].chksum == 0, "inbound zero UDP checksum was changed"
    assert (o.pkt[IP].dst, o.pkt[UDP].dport) == (SUB_A, 40002)


@pytest.mark.parametrize("selection", ["preserve", "random"])
def test_endpoint_independent_mapping_udp(replay, selection):
    """RFC 4787 REQ-1: the NAT MUST have Endpoint-Independent Mapping: the same
    internal address:port is mapped to the same external address:port for any
    destination address and port."""
    s = Scenario(replay, h.make_config(pool=[POOL28], nat={"port_selection": selection}))
    dests = [(SRV1, 53), (SRV2, 5000), (SRV3, 123), (SRV1, 54)]
    for i, (d, dp) in enumerate(dests):
        s.add(T0 + i * 0.1, "inside", udp_out(SUB_A, 40000, d, dp, b"eim%d" % i))
    outs, _ = s.run()
    exts = set()
    for i, (d, dp) in enumerate(dests):
        o = one(outs, "outside", has_payload(b"eim%d" % i))
        assert (o.pkt[IP].dst, o.pkt[UDP].dport) == (d, dp)
        exts.add((o.pkt[IP].src, o.pkt[UDP].sport))
    assert len(exts) == 1, f"mapping depends on the destination: {exts}"
    assert in_net(next(iter(exts))[0], POOL28), "not translated"


def test_port_parity_when_preserved_port_taken(replay):
    """RFC 4787 REQ-4 (port parity preservation, RECOMMENDED; contract
    port_parity = true) and REQ-3 (no port overloading): when the preserved port
    is held by another subscriber, the new external port differs and keeps the
    parity of the source port."""
    s = Scenario(replay, h.make_config(pool=[POOL1 + "/32"]))
    s.add(T0, "inside", udp_out(SUB_B, 40001, SRV1, 53, b"b-odd"))
    s.add(T0 + 0.1, "inside", udp_out(SUB_B, 40002, SRV1, 53, b"b-even"))
    s.add(T0 + 0.2, "inside", udp_out(SUB_A, 40001, SRV1, 53, b"a-odd"))
    s.add(T0 + 0.3, "inside", udp_out(SUB_A, 40002, SRV1, 53, b"a-even"))
    outs, _ = s.run()
    b_odd = one(outs, "outside", has_payload(b"b-odd")).pkt[UDP].sport
    b_even = one(outs, "outside", has_payload(b"b-even")).pkt[UDP].sport
    assert (b_odd, b_even) == (40001, 40002), "free ports were not preserved"
    a_odd = one(outs, "outside", has_payload(b"a-odd")).pkt
    a_even = one(outs, "outside", has_payload(b"a-even")).pkt
    assert a_odd[IP].src == POOL1 and a_even[IP].src == POOL1
    assert a_odd[UDP].sport != 40001 and a_even[UDP].sport != 40002
    assert a_odd[UDP].sport % 2 == 1, f"odd source port mapped to even {a_odd[UDP].sport}"
    assert a_even[UDP].sport % 2 == 0, f"even source port mapped to odd {a_even[UDP].sport}"
    for p in (a_odd[UDP].sport, a_even[UDP].sport):
        assert 1024 <= p <= 65535


def test_random_port_selection_keeps_parity(replay):
    """RFC 4787 REQ-4 with port_selection = "random" (RFC 6056 style): parity is
    still preserved for every allocated port, and ports are in range."""
    s = Scenario(replay, h.make_config(pool=[POOL1 + "/32"], nat={"port_selection": "random"}))
    sports = [40000, 40001, 1025, 65535, 5000, 5001, 33333, 44444]
    for i, sp in enumerate(sports):
        s.add(T0 + i * 0.01, "inside", udp_out(SUB_A, sp, SRV1, 53, b"r%d" % i))
    outs, _ = s.run()
    seen = set()
    same = 0
    for i, sp in enumerate(sports):
        o = one(outs, "outside", has_payload(b"r%d" % i)).pkt
        assert o[IP].src == POOL1
        p = o[UDP].sport
        assert p % 2 == sp % 2, f"parity not kept: {sp} -> {p}"
        assert 1024 <= p <= 65535
        same += p == sp
        seen.add(p)
    assert len(seen) == len(sports)
    assert same < 3, f"port_selection = random preserved {same} of {len(sports)} source ports"


def test_no_port_overloading_same_source_port(replay):
    """RFC 4787 REQ-3 / RFC 5382 REQ-7: the NAT MUST NOT have Port Overloading
    behaviour: two subscribers using the same source port towards the same
    server get distinct external ports on the single pool address, and replies
    reach the right subscriber."""
    s = Scenario(replay, h.make_config(pool=[POOL1 + "/32"]))
    s.add(T0, "inside", udp_out(SUB_A, 5060, SRV1, 5060, b"from-a"))
    s.add(T0 + 0.1, "inside", udp_out(SUB_B, 5060, SRV1, 5060, b"from-b"))
    outs, _ = s.run()
    oa = one(outs, "outside", has_payload(b"from-a")).pkt
    ob = one(outs, "outside", has_payload(b"from-b")).pkt
    assert oa[IP].src == ob[IP].src == POOL1
    assert oa[UDP].sport != ob[UDP].sport, "port overloading: both subscribers share one external port"
    s.add(T0 + 0.2, "outside", udp_in(SRV1, 5060, POOL1, ob[UDP].sport, b"to-b"))
    s.add(T0 + 0.3, "outside", udp_in(SRV1, 5060, POOL1, oa[UDP].sport, b"to-a"))
    outs, _ = s.run()
    ra = one(outs, "inside", has_payload(b"to-a")).pkt
    rb = one(outs, "inside", has_payload(b"to-b")).pkt
    assert (ra[IP].dst, ra[UDP].dport) == (SUB_A, 5060)
    assert (rb[IP].dst, rb[UDP].dport) == (SUB_B, 5060)


def test_port_range_respected(replay):
    """Contract [nat] ports: external ports come from the configured range; a
    source port inside the range and free is preserved (RFC 4787 REQ-3 port
    preservation is allowed when there is no collision)."""
    s = Scenario(replay, h.make_config(pool=[POOL1 + "/32"], nat={"ports": "20000-20099"}))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"outside-range"))
    s.add(T0 + 0.1, "inside", udp_out(SUB_A, 20050, SRV1, 53, b"inside-range"))
    outs, _ = s.run()
    p1 = one(outs, "outside", has_payload(b"outside-range")).pkt[UDP].sport
    p2 = one(outs, "outside", has_payload(b"inside-range")).pkt[UDP].sport
    assert 20000 <= p1 <= 20099, f"port {p1} outside the configured range"
    assert p1 % 2 == 0, "parity of 40000 not kept"
    assert p2 == 20050


def test_udp_mapping_refresh_and_timeout(replay):
    """RFC 4787 REQ-5 (UDP mapping timer MUST NOT expire in less than 2 min) and
    REQ-6 (outbound refresh MUST be true); contract inbound_refresh = false by
    default: inbound packets do not extend the mapping, so it expires 2 min
    (udp = "2m") after the last outbound packet."""
    s = Scenario(replay, h.make_config(timeouts={"udp": "2m"}))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"o1"))
    s.add(T0 + 100, "outside", udp_in(SRV1, 53, POOL1, 40000, b"i1"))     # alive
    s.add(T0 + 110, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"o2"))     # refresh -> until T0+230
    s.add(T0 + 200, "outside", udp_in(SRV1, 53, POOL1, 40000, b"i2"))     # alive
    s.add(T0 + 240, "outside", udp_in(SRV1, 53, POOL1, 40000, b"i3"))     # expired
    outs, _ = s.run()
    assert one(outs, "outside", has_payload(b"o1")).pkt[UDP].sport == 40000
    one(outs, "inside", has_payload(b"i1"), "reply within 2 min")
    one(outs, "inside", has_payload(b"i2"), "reply after an outbound refresh")
    none_of(outs, "inside", has_payload(b"i3"), "reply after the mapping expired")


def test_udp_inbound_refresh_enabled(replay):
    """Contract inbound_refresh = true (RFC 4787 REQ-6: inbound refresh MAY be
    true): an inbound packet then also extends the mapping."""
    s = Scenario(replay, h.make_config(nat={"inbound_refresh": True}, timeouts={"udp": "2m"}))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"o1"))
    s.add(T0 + 100, "outside", udp_in(SRV1, 53, POOL1, 40000, b"i1"))
    s.add(T0 + 200, "outside", udp_in(SRV1, 53, POOL1, 40000, b"i2"))
    outs, _ = s.run()
    assert one(outs, "outside", has_payload(b"o1")).pkt[IP].src == POOL1
    one(outs, "inside", has_payload(b"i1"))
    p = one(outs, "inside", has_payload(b"i2"), "reply after an inbound refresh").pkt
    assert (p[IP].dst, p[UDP].dport) == (SUB_A, 40000)


def test_udp_default_timeout_at_least_two_minutes(replay):
    """RFC 4787 REQ-5: UDP mapping timer MUST NOT expire in less than two
    minutes; default of five minutes or more RECOMMENDED (contract udp = 5m)."""
    s = Scenario(replay, h.make_config())
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"o1"))
    s.add(T0 + 290, "outside", udp_in(SRV1, 53, POOL1, 40000, b"late"))
    outs, _ = s.run()
    p = one(outs, "inside", has_payload(b"late"), "reply 290 s after the last outbound packet").pkt
    assert (p[IP].dst, p[UDP].dport) == (SUB_A, 40000)


def test_vlan_tag_kept(replay):
    """Contract: frames keep their Ethernet header and 802.1Q tags unchanged while
    the IPv4 packet inside is translated."""
    s = Scenario(replay, h.make_config())
    fo = s.add(T0, "inside", Ether(src=h.mac_for(SUB_A), dst=h.NAT_IN_MAC) / Dot1Q(vlan=100)
               / IP(src=SUB_A, dst=SRV1, ttl=64) / UDP(sport=40000, dport=53) / Raw(b"vl-out"))
    fi = s.add(T0 + 0.1, "outside", Ether(src=h.GW_MAC, dst=h.NAT_OUT_MAC) / Dot1Q(vlan=200)
               / IP(src=SRV1, dst=POOL1, ttl=64) / UDP(sport=53, dport=40000) / Raw(b"vl-in"))
    outs, _ = s.run()
    o = one(outs, "outside", has_payload(b"vl-out"))
    assert Dot1Q in o.pkt and o.pkt[Dot1Q].vlan == 100
    assert o.pkt.original[:16] == bytes(fo)[:16]
    assert (o.pkt[IP].src, o.pkt[UDP].sport, o.pkt[IP].ttl) == (POOL1, 40000, 63)
    i = one(outs, "inside", has_payload(b"vl-in"))
    assert Dot1Q in i.pkt and i.pkt[Dot1Q].vlan == 200
    assert i.pkt.original[:16] == bytes(fi)[:16]
    assert (i.pkt[IP].dst, i.pkt[UDP].dport) == (SUB_A, 40000)
