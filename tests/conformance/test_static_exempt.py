"""Static mappings and administrative exemption (contract [nat] static, and RFC 6888
REQ-6 ("It must be possible to administratively turn off
translation for specific destination addresses and/or ports"); contract keys
[nat] static and [nat] exempt)."""

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, POOL1, POOL28, SRV1, SRV2, SUB_A, T0, TCP, UDP, echo_out, echo_reply_in, echo_with, has_payload,
    in_net, none_of, one, pick, tcp_in, tcp_out, tcp_seq, udp_in, udp_out,
)

STATIC_HOST = "100.64.0.5"
STATIC_CFG = h.make_config(
    pool=[POOL1 + "/32"],
    nat={"static": [
        {"proto": "tcp", "inside": STATIC_HOST + ":22", "outside": POOL1 + ":2222"},
        {"proto": "udp", "inside": STATIC_HOST + ":5060", "outside": POOL1 + ":5062"},
    ]},
)


def test_static_mappings(replay):
    """Contract [nat] static: an external address:port is bound to an internal
    address:port per protocol.
    - An inbound TCP SYN to the static endpoint is forwarded at once to the
      internal endpoint without any prior outbound packet (it is not an
      unsolicited SYN: a mapping exists, RFC 5382 / contract), no ICMP;
    - the server's reply leaves with the static external address:port;
    - a new outbound connection from the static internal endpoint uses the
      static external port (endpoint-independent mapping, RFC 5382 REQ-1);
    - UDP static mapping likewise, both directions, and it does not expire
      (the contract: static assignments persist; here 2 h after the last use);
    - static mappings are per protocol: UDP to the TCP static port is dropped;
    - dynamic allocation never hands out a static external port (no port
      overloading, RFC 4787 REQ-3): another subscriber using source port 2222
      gets another external port."""
    frames = [
        (T0, "outside", tcp_in(SRV1, 5555, POOL1, 2222, "S", seq=7000)),
        (T0 + 0.1, "inside", tcp_out(STATIC_HOST, 22, SRV1, 5555, "SA", seq=100, ack=7001)),
        (T0 + 0.2, "outside", tcp_in(SRV1, 5555, POOL1, 2222, "A", seq=7001, ack=101)),
        (T0 + 1, "inside", tcp_out(STATIC_HOST, 22, SRV2, 80, "S", seq=300)),
        (T0 + 2, "outside", udp_in(SRV2, 7000, POOL1, 5062, b"sip-in")),
        (T0 + 2.1, "inside", udp_out(STATIC_HOST, 5060, SRV2, 7000, b"sip-out")),
        (T0 + 2.2, "inside", udp_out(STATIC_HOST, 5060, SRV1, 5060, b"sip-out2")),
        (T0 + 3, "outside", udp_in(SRV1, 5555, POOL1, 2222, b"udp-to-tcp-static")),
        (T0 + 4, "inside", tcp_out(SUB_A, 2222, SRV1, 80, "S", seq=900)),
        (T0 + 4.1, "inside", udp_out(SUB_A, 5062, SRV1, 53, b"a-5062")),
        (T0 + 7200, "outside", udp_in(SRV2, 7001, POOL1, 5062, b"sip-late")),
    ]
    outs, rep = replay(STATIC_CFG, frames)
    p = one(outs, "inside", tcp_seq(7000, "S"), "SYN to the static mapping").pkt
    assert (p[IP].src, p[TCP].sport, p[IP].dst, p[TCP].dport) == (SRV1, 5555, STATIC_HOST, 22)
    assert p[IP].ttl == 63
    p = one(outs, "outside", tcp_seq(100, "SA")).pkt
    assert (p[IP].src, p[TCP].sport, p[IP].dst, p[TCP].dport) == (POOL1, 2222, SRV1, 5555)
    one(outs, "inside", tcp_seq(7001, "A"))
    p = one(outs, "outside", tcp_seq(300, "S"), "new outbound SYN from the static endpoint").pkt
    assert (p[IP].src, p[TCP].sport) == (POOL1, 2222)
    p = one(outs, "inside", has_payload(b"sip-in"), "UDP to the static mapping").pkt
    assert (p[IP].dst, p[UDP].dport, p[IP].src, p[UDP].sport) == (STATIC_HOST, 5060, SRV2, 7000)
    for tag in (b"sip-out", b"sip-out2"):
        p = one(outs, "outside", has_payload(tag)).pkt
        assert (p[IP].src, p[UDP].sport) == (POOL1, 5062), tag
    none_of(outs, "inside", has_payload(b"udp-to-tcp-static"), "UDP datagram to a TCP-only static port")
    p = one(outs, "outside", tcp_seq(900, "S")).pkt
    assert p[IP].src == POOL1 and p[TCP].sport != 2222, "static external TCP port handed to another subscriber"
    p = one(outs, "outside", has_payload(b"a-5062")).pkt
    assert p[UDP].sport != 5062, "static external UDP port handed to another subscriber"
    p = one(outs, "inside", has_payload(b"sip-late"), "UDP to the static mapping 2 h later").pkt
    assert (p[IP].dst, p[UDP].dport) == (STATIC_HOST, 5060)
    none_of(outs, None, h.is_icmp, "ICMP")


def test_static_mapping_paired_pooling(replay):
    """Contract (paired pooling: one external address for all protocols while
    the subscriber holds any mapping) and RFC 4787 REQ-2: a subscriber with a
    static mapping on 203.0.113.3 gets its dynamic mappings on 203.0.113.3 too,
    even though the pool offers 16 addresses."""
    cfg = h.make_config(pool=[POOL28], nat={"static": [
        {"proto": "tcp", "inside": STATIC_HOST + ":22", "outside": "203.0.113.3:2222"}]})
    frames = [(T0 + i * 0.01, "inside", udp_out(STATIC_HOST, 40000 + i, SRV1, 53, b"dyn%d" % i)) for i in range(4)]
    frames.append((T0 + 1, "inside", echo_out(STATIC_HOST, SRV1, 0x77, seq=5)))
    outs, _ = replay(cfg, frames)
    for i in range(4):
        assert one(outs, "outside", has_payload(b"dyn%d" % i)).pkt[IP].src == "203.0.113.3"
    assert one(outs, "outside", echo_with(8, 5)).pkt[IP].src == "203.0.113.3"


EXEMPT_CFG = h.make_config(
    pool=[POOL1 + "/32"],
    nat={"exempt": ["192.0.2.0/24", "198.51.100.53/32:53", "198.51.100.64/26:8000-8080"]},
)


def test_exempt_destinations_pass_untranslated(replay):
    """RFC 6888 REQ-6: translation can be turned off for destination prefixes
    and ports (contract [nat] exempt, "prefix" or "prefix:port[-port]").
    Packets to an exempt prefix leave with the subscriber's own source address
    and port (routed: only the TTL changes); a prefix:port rule exempts only
    that destination port (range, inclusive); everything else is translated.
    Exempt traffic creates no mapping."""
    X = "192.0.2.30"
    cases = [
        # (tag, proto, dst, dport, exempt?)
        ("x-udp", "udp", X, 9999, True),
        ("x-tcp", "tcp", X, 443, True),
        ("dns53", "udp", "198.51.100.53", 53, True),
        ("dns54", "udp", "198.51.100.53", 54, False),
        ("dns-other-host", "udp", "198.51.100.54", 53, False),
        ("r8000", "tcp", "198.51.100.70", 8000, True),
        ("r8080", "udp", "198.51.100.127", 8080, True),
        ("r8081", "tcp", "198.51.100.70", 8081, False),
        ("r7999", "udp", "198.51.100.70", 7999, False),
        ("r-off-prefix", "tcp", "198.51.100.128", 8000, False),
    ]
    frames = []
    sent = {}
    for i, (tag, proto, dst, dport, _x) in enumerate(cases):
        sport = 41000 + i
        if proto == "udp":
            f = udp_out(SUB_A, sport, dst, dport, tag.encode())
        else:
            f = tcp_out(SUB_A, sport, dst, dport, "S", seq=1000 + i)
        sent[tag] = (sport, f)
        frames.append((T0 + i * 0.01, "inside", f))
    frames.append((T0 + 1, "inside", echo_out(SUB_A, X, 0x4242, seq=77, payload=b"x-ping")))
    outs, rep = replay(EXEMPT_CFG, frames)
    translated = 0
    for i, (tag, proto, dst, dport, exempt) in enumerate(cases):
        sport, f = sent[tag]
        if proto == "udp":
            p = one(outs, "outside", has_payload(tag.encode()), tag).pkt
            got = (p[IP].src, p[UDP].sport, p[IP].dst, p[UDP].dport)
        else:
            p = one(outs, "outside", tcp_seq(1000 + i, "S"), tag).pkt
            got = (p[IP].src, p[TCP].sport, p[IP].dst, p[TCP].dport)
        assert p[IP].ttl == 63, tag
        if exempt:
            assert got == (SUB_A, sport, dst, dport), f"{tag}: exempt destination was translated: {got}"
            assert h.ip_bytes(p)[20:] == h.ip_bytes(f)[20:], f"{tag}: exempt packet's transport bytes changed"
        else:
            translated += 1
            assert got[0] == POOL1 and got[2:] == (dst, dport), f"{tag}: not translated: {got}"
    p = one(outs, "outside", echo_with(8, 77), "echo to an exempt prefix").pkt
    assert (p[IP].src, p[ICMP].id) == (SUB_A, 0x4242), "echo to an exempt prefix was translated"
    assert rep["mappings_created"] == translated, rep


def test_exempt_return_traffic(replay):
    """RFC 6888 REQ-6 (translation turned off for a destination): the exempt
    flow must work both ways, so the exempt server's answer to the subscriber's
    own address passes untranslated to the inside; a packet from a
    non-exempt host to the subscriber's inside address is not let in."""
    X = "192.0.2.30"
    frames = [
        (T0, "inside", udp_out(SUB_A, 40000, X, 9999, b"x-q")),
        (T0 + 0.1, "outside", udp_in(X, 9999, SUB_A, 40000, b"x-answer")),
        (T0 + 0.2, "outside", udp_in(SRV2, 9999, SUB_A, 40000, b"not-exempt-in")),
    ]
    outs, _ = replay(EXEMPT_CFG, frames)
    p = one(outs, "inside", has_payload(b"x-answer"), "answer from the exempt server").pkt
    assert (p[IP].src, p[UDP].sport, p[IP].dst, p[UDP].dport) == (X, 9999, SUB_A, 40000)
    assert p[IP].ttl == 63
    none_of(outs, "inside", has_payload(b"not-exempt-in"), "untranslated packet from a non-exempt host")
