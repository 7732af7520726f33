"""ICMP query and error handling (RFC 5508, RFC 5382 REQ-9/REQ-10, RFC 4787 REQ-12)."""

import struct

from scapy.utils import checksum

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, POOL1, SRV1, SRV2, SUB_A, SUB_B, T0, TCP, UDP, echo_out, echo_reply_in, echo_with, eth_in, eth_out,
    has_payload, icmp_error, icmp_info, ip_bytes, none_of, one, pick, tcp_out, tcp_seq, udp_in, udp_out,
)

ROUTER = "198.51.100.99"  # an intermediate router on the outside


def test_icmp_echo_translation(replay):
    """RFC 5508 REQ-1: a NAT MUST permit ICMP queries initiated from the private
    realm and their responses; the query identifier plays the role of the port
    (contract): echo requests leave with the pool address and an external
    identifier, replies come back with the original identifier. Two subscribers
    using the same identifier get distinct external identifiers."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", echo_out(SUB_A, SRV1, 0x1234, seq=1, payload=b"ping-a"))
    s.add(T0 + 0.1, "inside", echo_out(SUB_B, SRV1, 0x1234, seq=2, payload=b"ping-b"))
    outs, _ = s.run()
    a = one(outs, "outside", echo_with(8, 1)).pkt
    b = one(outs, "outside", echo_with(8, 2)).pkt
    assert a[IP].src == POOL1 and b[IP].src == POOL1
    assert a[IP].ttl == 63
    assert a[ICMP].id != b[ICMP].id, "two subscribers share one external ICMP identifier"
    assert h.l4_data(a) == b"ping-a"
    s.add(T0 + 0.2, "outside", echo_reply_in(SRV1, POOL1, b[ICMP].id, seq=2, payload=b"ping-b"))
    s.add(T0 + 0.3, "outside", echo_reply_in(SRV1, POOL1, a[ICMP].id, seq=1, payload=b"ping-a"))
    outs, _ = s.run()
    ra = one(outs, "inside", echo_with(0, 1)).pkt
    rb = one(outs, "inside", echo_with(0, 2)).pkt
    assert (ra[IP].src, ra[IP].dst, ra[ICMP].id) == (SRV1, SUB_A, 0x1234)
    assert (rb[IP].src, rb[IP].dst, rb[ICMP].id) == (SRV1, SUB_B, 0x1234)
    assert h.l4_data(ra) == b"ping-a"


def test_icmp_query_timeout_at_least_60s(replay):
    """RFC 5508 REQ-2: an ICMP Query session timer MUST NOT expire in less than
    60 seconds: a reply 59 s after the request still gets through."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", echo_out(SUB_A, SRV1, 0x4321, seq=9))
    outs, _ = s.run()
    ext_id = one(outs, "outside", echo_with(8, 9)).pkt[ICMP].id
    s.add(T0 + 59, "outside", echo_reply_in(SRV1, POOL1, ext_id, seq=9))
    outs, _ = s.run()
    r = one(outs, "inside", echo_with(0, 9)).pkt
    assert (r[IP].dst, r[ICMP].id) == (SUB_A, 0x4321)


def _occupy(s, t):
    """Let SUB_B take the ports SUB_A will use, so A's external ports differ
    from its source ports and embedded translation is observable."""
    s.add(t, "inside", udp_out(SUB_B, 40000, SRV2, 9, b"occupy-udp"))
    s.add(t + 0.01, "inside", tcp_out(SUB_B, 41000, SRV2, 9, "S", seq=31337))


def test_inbound_icmp_error_udp(replay):
    """RFC 5508 REQ-3 (sec 4.1/4.2) / RFC 4787 REQ-12 / RFC 5382 REQ-9: an ICMP
    error from outside about a translated packet is forwarded with its outer
    destination and the embedded source address and port reverted to the
    subscriber's; type and code unchanged; the ICMP checksum, the embedded IP
    header checksum and (the datagram being complete) the embedded UDP checksum
    are valid."""
    s = h.Scenario(replay, h.make_config())
    _occupy(s, T0)
    s.add(T0 + 1, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"query-a"))
    outs, _ = s.run()
    sent = one(outs, "outside", has_payload(b"query-a")).pkt
    ext_port = sent[UDP].sport
    assert ext_port != 40000
    s.add(T0 + 2, "outside", icmp_error(eth_out(), SRV1, POOL1, ip_bytes(sent), 3, 3))
    outs, _ = s.run()
    e = one(outs, "inside", h.is_icmp_error, "translated ICMP error")
    t, c, emb = icmp_info(e.pkt)
    assert (t, c) == (3, 3)
    assert (e.pkt[IP].src, e.pkt[IP].dst) == (SRV1, SUB_A)
    assert e.pkt[IP].ttl == 63
    assert (emb.src, emb.sport, emb.dst, emb.dport) == (SUB_A, 40000, SRV1, 53)
    assert emb.header_checksum_ok, "embedded IPv4 header checksum not updated"
    assert emb.complete and emb.transport_checksum_ok(), "embedded UDP checksum not updated"
    assert emb.l4[8:] == b"query-a"


def test_inbound_icmp_error_udp_zero_checksum(replay):
    """RFC 5508 / RFC 768: when the embedded UDP datagram carries no checksum
    (0) it stays 0 after the embedded translation (contract)."""
    s = h.Scenario(replay, h.make_config())
    _occupy(s, T0)
    s.add(T0 + 1, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"nock", chksum=0))
    outs, _ = s.run()
    sent = one(outs, "outside", has_payload(b"nock")).pkt
    assert sent[UDP].chksum == 0
    assert sent[IP].src == POOL1 and sent[UDP].sport != 40000, "precondition: A's port was remapped"
    s.add(T0 + 2, "outside", icmp_error(eth_out(), SRV1, POOL1, ip_bytes(sent), 3, 3))
    outs, _ = s.run()
    e = one(outs, "inside", h.is_icmp_error)
    _, _, emb = icmp_info(e.pkt)
    assert (emb.src, emb.sport) == (SUB_A, 40000)
    assert emb.udp_checksum == 0, "zero embedded UDP checksum was changed"
    assert emb.header_checksum_ok


def test_inbound_icmp_error_tcp_8_bytes(replay):
    """RFC 5382 REQ-9 / RFC 5508 sec 4.2 / RFC 792: an ICMP error may carry only
    the IP header plus the first 8 bytes of the TCP header; the NAT still
    translates it (embedded source address and port reverted, embedded IP
    header checksum valid, outer destination = subscriber)."""
    s = h.Scenario(replay, h.make_config())
    _occupy(s, T0)
    s.add(T0 + 1, "inside", tcp_out(SUB_A, 41000, SRV1, 80, "S", seq=4242))
    outs, _ = s.run()
    sent = one(outs, "outside", tcp_seq(4242, "S")).pkt
    assert sent[TCP].sport != 41000
    ipb = ip_bytes(sent)
    s.add(T0 + 2, "outside", icmp_error(eth_out(), ROUTER, POOL1, ipb[:28], 3, 1))
    outs, _ = s.run()
    e = one(outs, "inside", h.is_icmp_error)
    t, c, emb = icmp_info(e.pkt)
    assert (t, c) == (3, 1)
    assert (e.pkt[IP].src, e.pkt[IP].dst) == (ROUTER, SUB_A)
    assert (emb.src, emb.sport, emb.dst, emb.dport) == (SUB_A, 41000, SRV1, 80)
    assert len(emb.l4) == 8
    assert struct.unpack("!I", emb.l4[4:8])[0] == 4242, "embedded TCP sequence number changed"
    assert emb.header_checksum_ok


def test_inbound_icmp_error_about_echo(replay):
    """RFC 5508 sec 4.2 / REQ-3: an ICMP error (time exceeded from a router)
    about a translated echo request is translated back: embedded source and
    identifier reverted, embedded ICMP checksum consistent."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", echo_out(SUB_B, SRV1, 0x2222, seq=1))
    s.add(T0 + 0.1, "inside", echo_out(SUB_A, SRV1, 0x2222, seq=2, payload=b"traceroute"))
    outs, _ = s.run()
    sent = one(outs, "outside", echo_with(8, 2)).pkt
    assert sent[ICMP].id != 0x2222
    s.add(T0 + 1, "outside", icmp_error(eth_out(), ROUTER, POOL1, ip_bytes(sent), 11, 0))
    outs, _ = s.run()
    e = one(outs, "inside", h.is_icmp_error)
    t, c, emb = icmp_info(e.pkt)
    assert (t, c) == (11, 0)
    assert (e.pkt[IP].src, e.pkt[IP].dst) == (ROUTER, SUB_A)
    assert (emb.src, emb.dst, emb.icmp_id) == (SUB_A, SRV1, 0x2222)
    assert emb.header_checksum_ok
    assert emb.complete and emb.transport_checksum_ok(), "embedded ICMP echo checksum not updated"


def test_inbound_icmp_error_invalid_or_unmatched_dropped_and_mapping_kept(replay):
    """RFC 5508 REQ-3/REQ-8 (sec 4.4, 4.5): an ICMP error whose ICMP checksum
    fails SHOULD be silently dropped; one whose embedded IP header checksum fails
    SHOULD be silently dropped; one for which there is no mapping SHOULD be
    silently dropped. RFC 5382 REQ-10 / RFC 4787 REQ-12: receipt of ICMP MUST
    NOT terminate the mapping: the flow keeps working afterwards."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q"))
    outs, _ = s.run()
    sent = one(outs, "outside", has_payload(b"q")).pkt
    ext_port = sent[UDP].sport
    emb = ip_bytes(sent)

    good = icmp_error(eth_out(), SRV1, POOL1, emb, 3, 3)
    good_ck = IP(bytes(good[IP]))[ICMP].chksum
    bad_icmp = icmp_error(eth_out(), SRV1, POOL1, emb, 3, 3, icmp_chksum=good_ck ^ 0x0101)
    emb_bad = bytearray(emb)
    emb_bad[10] ^= 0x5A  # corrupt the embedded IP header checksum
    bad_emb = icmp_error(eth_out(), SRV1, POOL1, bytes(emb_bad), 3, 3)
    nomap = bytes(IP(src=POOL1, dst=SRV1, ttl=63) / UDP(sport=45000, dport=53) / b"never-sent")
    unmatched = icmp_error(eth_out(), SRV1, POOL1, nomap, 3, 3)
    s.add(T0 + 1, "outside", bad_icmp)
    s.add(T0 + 2, "outside", bad_emb)
    s.add(T0 + 3, "outside", unmatched)
    # the mapping must survive all of them (and a valid error too)
    s.add(T0 + 4, "outside", good)
    s.add(T0 + 5, "outside", udp_in(SRV1, 53, POOL1, ext_port, b"answer"))
    s.add(T0 + 6, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q2"))
    outs, rep = s.run()
    errs = pick(outs, None, h.is_icmp_error)
    assert len(errs) == 1, f"only the valid ICMP error may be forwarded\n{h.dump(outs)}"
    assert abs(errs[0].ts - (T0 + 4)) < 1e-6
    assert rep["drops"].get("icmp_bad_checksum", 0) == 1, rep["drops"]
    assert rep["drops"].get("icmp_embedded_invalid", 0) == 1, rep["drops"]
    assert rep["drops"].get("icmp_error_no_mapping", 0) == 1, rep["drops"]
    a = one(outs, "inside", has_payload(b"answer"), "reply after ICMP errors").pkt
    assert (a[IP].dst, a[UDP].dport) == (SUB_A, 40000)
    q2 = one(outs, "outside", has_payload(b"q2")).pkt
    assert (q2[IP].src, q2[UDP].sport) == (POOL1, ext_port)


def test_icmp_error_does_not_refresh_mapping(replay):
    """RFC 5508 REQ-5/sec 4.3 (contract: no mapping is refreshed by an ICMP
    error): with udp = 2m, an ICMP error at T0+100 does not extend the mapping
    created at T0, so a reply at T0+130 is dropped."""
    s = h.Scenario(replay, h.make_config(timeouts={"udp": "2m"}))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q"))
    outs, _ = s.run()
    sent = one(outs, "outside", has_payload(b"q")).pkt
    s.add(T0 + 100, "outside", icmp_error(eth_out(), SRV1, POOL1, ip_bytes(sent), 3, 3))
    s.add(T0 + 130, "outside", udp_in(SRV1, 53, POOL1, sent[UDP].sport, b"too-late"))
    outs, _ = s.run()
    one(outs, "inside", h.is_icmp_error, "error within the mapping lifetime")
    none_of(outs, "inside", has_payload(b"too-late"), "reply after expiry")


def test_outbound_icmp_error(replay):
    """RFC 5508 REQ-4 (sec 4.3): an ICMP error sent by a subscriber about an
    inbound packet is translated: outer source becomes the subscriber's external
    address, the embedded destination address and port become the external
    address:port; embedded checksums stay valid."""
    s = h.Scenario(replay, h.make_config())
    _occupy(s, T0)
    s.add(T0 + 1, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q"))
    outs, _ = s.run()
    sent = one(outs, "outside", has_payload(b"q")).pkt
    ext_port = sent[UDP].sport
    assert ext_port != 40000
    s.add(T0 + 2, "outside", udp_in(SRV1, 53, POOL1, ext_port, b"unwanted"))
    outs, _ = s.run()
    got = one(outs, "inside", has_payload(b"unwanted")).pkt
    s.add(T0 + 3, "inside", icmp_error(eth_in(SUB_A), SUB_A, SRV1, ip_bytes(got), 3, 3))
    outs, _ = s.run()
    e = one(outs, "outside", h.is_icmp_error, "translated outbound ICMP error")
    t, c, emb = icmp_info(e.pkt)
    assert (t, c) == (3, 3)
    assert (e.pkt[IP].src, e.pkt[IP].dst) == (POOL1, SRV1)
    assert e.pkt[IP].ttl == 63
    assert (emb.src, emb.sport, emb.dst, emb.dport) == (SRV1, 53, POOL1, ext_port)
    assert emb.header_checksum_ok
    assert emb.complete and emb.transport_checksum_ok()
    assert emb.l4[8:] == b"unwanted"


def test_outbound_icmp_error_without_mapping_dropped(replay):
    """RFC 5508 REQ-4: an ICMP error from the private realm for which the NAT has
    no mapping SHOULD be silently dropped."""
    s = h.Scenario(replay, h.make_config())
    fake = bytes(IP(src=SRV2, dst=SUB_A, ttl=60) / UDP(sport=99, dport=45678) / b"x")
    s.add(T0, "inside", icmp_error(eth_in(SUB_A), SUB_A, SRV2, fake, 3, 3))
    outs, rep = s.run()
    assert not outs, h.dump(outs)
    assert rep["drops"].get("icmp_error_no_mapping", 0) == 1, rep["drops"]


def test_icmp_error_with_rfc4884_extension(replay):
    """RFC 5508 REQ-3 / RFC 4884: an ICMP time exceeded carrying a length
    field, the original datagram zero-padded to 128 bytes and an extension
    structure is translated: embedded source address and port reverted with
    valid embedded checksums (the padding and extension excluded), the length
    field, padding and extension structure forwarded unchanged, ICMP checksum
    valid."""
    s = h.Scenario(replay, h.make_config())
    _occupy(s, T0)
    s.add(T0 + 1, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q" * 20))
    outs, _ = s.run()
    sent = one(outs, "outside", has_payload(b"q" * 20)).pkt
    assert sent[UDP].sport != 40000
    emb = ip_bytes(sent)
    padded = emb + b"\x00" * (128 - len(emb))
    ext = bytearray(struct.pack("!BBH", 0x20, 0, 0) + struct.pack("!HBB", 8, 2, 1) + b"\x00\x00\x05\xdc")
    struct.pack_into("!H", ext, 2, checksum(bytes(ext)))
    icmp = bytearray(struct.pack("!BBHBBH", 11, 0, 0, 0, 32, 0) + padded + bytes(ext))
    struct.pack_into("!H", icmp, 2, checksum(bytes(icmp)))
    s.add(T0 + 2, "outside", eth_out() / IP(src=ROUTER, dst=POOL1, ttl=64, proto=1) / h.Raw(bytes(icmp)))
    outs, _ = s.run()
    e = one(outs, "inside", h.is_icmp_error).pkt
    seg = ip_bytes(e)[20:]
    assert (e[IP].src, e[IP].dst) == (ROUTER, SUB_A)
    assert seg[0:2] == b"\x0b\x00" and seg[5] == 32, "type/code or RFC 4884 length changed"
    assert len(seg) == 8 + 128 + len(ext)
    assert seg[8 + len(emb):8 + 128] == b"\x00" * (128 - len(emb)), "padding changed"
    assert seg[8 + 128:] == bytes(ext), "extension structure changed"
    inner = h.Embedded(seg[8:8 + len(emb)])
    assert (inner.src, inner.sport, inner.dst, inner.dport) == (SUB_A, 40000, SRV1, 53)
    assert inner.header_checksum_ok and inner.transport_checksum_ok()


def test_icmp_errors_under_restrictive_filtering(replay):
    """RFC 5508 sec 4.1/REQ-3 with RFC 4787 filtering: an ICMP error from an
    intermediate router (an address the subscriber never contacted) about an
    existing session is forwarded even with address(-and-port)-dependent
    filtering; an error quoting a session that does not exist on that mapping
    (another remote endpoint) is dropped (icmp_error_no_mapping)."""
    for mode in ("address-dependent", "address-and-port-dependent"):
        cfg = h.make_config(nat={"filtering": mode})
        s = h.Scenario(replay, cfg)
        s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q"))
        outs, _ = s.run()
        sent = one(outs, "outside", has_payload(b"q")).pkt
        s.add(T0 + 1, "outside", icmp_error(eth_out(), ROUTER, POOL1, ip_bytes(sent), 11, 0))
        fake = bytes(IP(src=POOL1, dst=SRV2, ttl=60) / UDP(sport=sent[UDP].sport, dport=999) / b"x")
        s.add(T0 + 2, "outside", icmp_error(eth_out(), ROUTER, POOL1, fake, 3, 3))
        outs, rep = s.run()
        e = one(outs, "inside", h.is_icmp_error, f"{mode}: error from a router").pkt
        assert e[IP].dst == SUB_A and abs(one(outs, "inside", h.is_icmp_error).ts - (T0 + 1)) < 1e-6
        assert rep["drops"] == {"icmp_error_no_mapping": 1}, (mode, rep["drops"])
