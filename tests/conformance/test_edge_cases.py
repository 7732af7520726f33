"""Edge cases of the wire and translation rules: checksum corner values
(RFC 768, RFC 1624), header fields a NAT must not touch, ICMP corner cases
(RFC 5508), martians (contract), hairpinning through filtering (RFC 4787),
paired pooling under exhaustion (RFC 4787 REQ-2, RFC 6888)."""

import struct

from scapy.utils import checksum

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, INSIDE_ADDR, POOL1, SRV1, SRV2, SUB_A, SUB_B, T0, TCP, UDP, Ether, Raw, echo_out, eth_in, eth_out,
    has_payload, icmp_error, icmp_info, ip_bytes, none_of, one, pick, tcp_in, tcp_out, udp_in, udp_out,
)

import socket

ROUTER = "198.51.100.99"


def _udp_with_translated_checksum_zero(src, sport, dst, dport, t_src, t_dst, t_sport, t_dport, tag):
    """A UDP datagram (valid checksum) whose checksum, once its addresses and
    ports are rewritten to (t_src:t_sport -> t_dst:t_dport), computes to 0, so
    RFC 768 requires it to be transmitted as 0xFFFF."""
    body = tag + b"\x00\x00"
    ulen = 8 + len(body)

    def csum(s, d, sp, dp, payload):
        hdr = struct.pack("!HHHH", sp, dp, ulen, 0)
        ph = socket.inet_aton(s) + socket.inet_aton(d) + struct.pack("!BBH", 0, 17, ulen)
        return checksum(ph + hdr + payload)

    c0 = csum(t_src, t_dst, t_sport, t_dport, body)
    if len(tag) % 2:
        raise ValueError("tag must have even length")
    body = tag + struct.pack("!H", c0)
    assert csum(t_src, t_dst, t_sport, t_dport, body) in (0, 0xFFFF)
    orig = csum(src, dst, sport, dport, body)
    assert orig not in (0, 0xFFFF), "pick another tag"
    return body


def test_udp_checksum_computing_to_zero_is_sent_as_ffff(replay):
    """RFC 768: "If the computed checksum is zero, it is transmitted as all
    ones"; a checksum field of 0 means "no checksum". A translated datagram
    whose new checksum computes to zero must carry 0xFFFF, not 0 (a classic
    RFC 1624 incremental-update pitfall), in both directions."""
    out_body = _udp_with_translated_checksum_zero(SUB_A, 40000, SRV1, 53, POOL1, SRV1, 40000, 53, b"ck-out")
    in_body = _udp_with_translated_checksum_zero(SRV1, 53, POOL1, 40000, SRV1, SUB_A, 53, 40000, b"ck-in!")
    frames = [(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, out_body)),
              (T0 + 0.1, "outside", udp_in(SRV1, 53, POOL1, 40000, in_body))]
    outs, _ = replay(h.make_config(), frames)
    o = one(outs, "outside", has_payload(out_body)).pkt
    assert (o[IP].src, o[UDP].sport) == (POOL1, 40000), "precondition: port preserved"
    assert o[UDP].chksum == 0xFFFF, f"outbound: checksum computing to 0 sent as {o[UDP].chksum:#06x}"
    i = one(outs, "inside", has_payload(in_body)).pkt
    assert (i[IP].dst, i[UDP].dport) == (SUB_A, 40000)
    assert i[UDP].chksum == 0xFFFF, f"inbound: checksum computing to 0 sent as {i[UDP].chksum:#06x}"


def test_input_checksum_ffff_translated(replay):
    """A datagram arriving with UDP checksum 0xFFFF (its computed checksum is
    0) is translated with a valid, non-zero checksum (the harness verifies it;
    here we also require it is not turned into 0 = "no checksum")."""
    body = _udp_with_translated_checksum_zero(SRV1, 1, POOL1, 2, SUB_A, SRV1, 40000, 53, b"ffff")
    p = udp_out(SUB_A, 40000, SRV1, 53, body)
    assert IP(bytes(p[IP]))[UDP].chksum == 0xFFFF
    outs, _ = replay(h.make_config(), [(T0, "inside", p)])
    o = one(outs, "outside", has_payload(body)).pkt
    assert o[IP].src == POOL1 and o[UDP].chksum != 0


def test_tos_df_and_ip_options_untouched(replay):
    """A NAT rewrites addresses, ports and checksums and the router TTL;
    DSCP/ECN (TOS), the DF flag and IP options pass unchanged both ways."""
    out = (eth_in(SUB_A) / IP(src=SUB_A, dst=SRV1, ttl=64, tos=0xB8, flags="DF", options=[b"\x94\x04\x00\x00"])
           / UDP(sport=40000, dport=53) / Raw(b"tos-out"))
    inn = (eth_out() / IP(src=SRV1, dst=POOL1, ttl=64, tos=0x02, flags="DF") / UDP(sport=53, dport=40000)
           / Raw(b"tos-in"))
    outs, _ = replay(h.make_config(), [(T0, "inside", out), (T0 + 0.1, "outside", inn)])
    o = one(outs, "outside", has_payload(b"tos-out")).pkt
    assert o[IP].src == POOL1
    assert (o[IP].tos, int(o[IP].flags), o[IP].ihl) == (0xB8, 2, 6)
    assert ip_bytes(o)[20:24] == b"\x94\x04\x00\x00", "IP options changed"
    i = one(outs, "inside", has_payload(b"tos-in")).pkt
    assert i[IP].dst == SUB_A
    assert (i[IP].tos, int(i[IP].flags)) == (0x02, 2)


def _occupy(frames, t):
    frames.append((t, "inside", udp_out(SUB_B, 40000, SRV2, 9, b"occupy-udp")))
    frames.append((t + 0.01, "inside", tcp_out(SUB_B, 41000, SRV2, 9, "S", seq=31337)))


def test_icmp_errors_with_ip_options_and_frag_needed(replay):
    """RFC 5508 REQ-3 (sec 4.5): the NAT must traverse IP options of the
    embedded header; options on the outer header must not confuse it either.
    An ICMP fragmentation-needed (3/4) keeps its next-hop MTU field (RFC 1191)
    through translation. All three errors reach the subscriber with the
    embedded source address and port reverted and valid checksums."""
    frames = []
    _occupy(frames, T0)
    sent_opt = (eth_in(SUB_A) / IP(src=SUB_A, dst=SRV1, ttl=64, options=[b"\x01\x01\x01\x00"])
                / UDP(sport=40000, dport=53) / Raw(b"with-options"))
    frames.append((T0 + 1, "inside", sent_opt))
    frames.append((T0 + 1.1, "inside", tcp_out(SUB_A, 41000, SRV1, 443, "S", seq=777)))
    outs, _ = replay(h.make_config(), frames)
    u = one(outs, "outside", has_payload(b"with-options")).pkt
    t = one(outs, "outside", h.tcp_seq(777, "S")).pkt
    assert u[UDP].sport != 40000 and t[TCP].sport != 41000, "precondition: ports remapped"
    ub, tb = ip_bytes(u), ip_bytes(t)
    assert (ub[0] & 0xF) == 6, "precondition: options kept on the way out"
    e_embopt = icmp_error(eth_out(), ROUTER, POOL1, ub, 11, 0)
    e_outeropt = (eth_out() / IP(src=ROUTER, dst=POOL1, ttl=64, options=[b"\x01\x01\x01\x00"])
                  / ICMP(type=3, code=3) / Raw(ub))
    e_mtu = eth_out() / IP(src=ROUTER, dst=POOL1, ttl=64) / ICMP(type=3, code=4, nexthopmtu=1400) / Raw(tb)
    frames += [(T0 + 2, "outside", e_embopt), (T0 + 3, "outside", e_outeropt), (T0 + 4, "outside", e_mtu)]
    outs, rep = replay(h.make_config(), frames)
    errs = sorted(pick(outs, "inside", h.is_icmp_error), key=lambda o: o.ts)
    assert len(errs) == 3, f"{rep['drops']}\n{h.dump(outs)}"
    for e, (ty, co) in zip(errs, [(11, 0), (3, 3), (3, 4)]):
        t_, c_, emb = icmp_info(e.pkt)
        assert (t_, c_) == (ty, co)
        assert (e.pkt[IP].src, e.pkt[IP].dst) == (ROUTER, SUB_A)
        assert emb.header_checksum_ok
        assert emb.src == SUB_A
    _, _, emb = icmp_info(errs[0].pkt)
    assert emb.ihl == 6 and emb.hdr[20:24] == b"\x01\x01\x01\x00"
    assert (emb.sport, emb.dport) == (40000, 53)
    assert emb.complete and emb.transport_checksum_ok()
    _, _, emb = icmp_info(errs[1].pkt)
    assert (emb.sport, emb.dport) == (40000, 53)
    _, _, emb = icmp_info(errs[2].pkt)
    assert (emb.sport, emb.dport) == (41000, 443)
    icmp_hdr = ip_bytes(errs[2].pkt)[20:28]
    assert struct.unpack("!H", icmp_hdr[6:8])[0] == 1400, "next-hop MTU changed"


def test_icmp_timestamp_query_translated(replay):
    """RFC 5508 REQ-1 and issue #3 ("echo and the other query types are
    translated by identifier"): ICMP timestamp request/reply (13/14) from two
    subscribers with the same identifier get distinct external identifiers and
    the replies return to the right subscriber with the original identifier."""
    def ts_req(src, ident, seq):
        return eth_in(src) / IP(src=src, dst=SRV1, ttl=64) / ICMP(type=13, id=ident, seq=seq, ts_ori=1000)
    frames = [(T0, "inside", ts_req(SUB_A, 0x3333, 1)), (T0 + 0.1, "inside", ts_req(SUB_B, 0x3333, 2))]
    outs, _ = replay(h.make_config(), frames)
    qa = one(outs, "outside", lambda p: h.is_icmp(p) and p[ICMP].type == 13 and p[ICMP].seq == 1).pkt
    qb = one(outs, "outside", lambda p: h.is_icmp(p) and p[ICMP].type == 13 and p[ICMP].seq == 2).pkt
    assert qa[IP].src == POOL1 == qb[IP].src
    assert qa[ICMP].id != qb[ICMP].id
    for q, seq in ((qa, 1), (qb, 2)):
        frames.append((T0 + 1 + seq, "outside", eth_out() / IP(src=SRV1, dst=POOL1, ttl=64)
                       / ICMP(type=14, id=q[ICMP].id, seq=seq, ts_ori=1000, ts_rx=2000, ts_tx=2001)))
    outs, _ = replay(h.make_config(), frames)
    ra = one(outs, "inside", lambda p: h.is_icmp(p) and p[ICMP].type == 14 and p[ICMP].seq == 1).pkt
    rb = one(outs, "inside", lambda p: h.is_icmp(p) and p[ICMP].type == 14 and p[ICMP].seq == 2).pkt
    assert (ra[IP].dst, ra[ICMP].id, ra[ICMP].ts_rx) == (SUB_A, 0x3333, 2000)
    assert (rb[IP].dst, rb[ICMP].id) == (SUB_B, 0x3333)


def test_icmp_unsupported_and_fragmented_errors_dropped(replay):
    """Contract drop reasons: a redirect (type 5) or router advertisement
    (type 9) arriving outside is not forwarded (icmp_unsupported); a
    fragmented ICMP error (its checksum cannot be validated) is not forwarded
    (icmp_error_fragmented). The mapping keeps working."""
    frames = [(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q"))]
    outs, _ = replay(h.make_config(), frames)
    emb = ip_bytes(one(outs, "outside", has_payload(b"q")).pkt)
    redirect = eth_out() / IP(src=ROUTER, dst=POOL1, ttl=64) / ICMP(type=5, code=1, gw=ROUTER) / Raw(emb)
    radv = eth_out() / IP(src=ROUTER, dst=POOL1, ttl=64) / ICMP(type=9, code=0) / Raw(b"\x00" * 8)
    big = bytes(IP(src=ROUTER, dst=POOL1, ttl=64, id=0x7777) / ICMP(type=3, code=3) / Raw(emb + b"\x00" * 600))
    fr = [p for p in h.fragment(IP(big), fragsize=304)]
    assert len(fr) >= 2
    frames += [(T0 + 1, "outside", redirect), (T0 + 2, "outside", radv)]
    frames += [(T0 + 3 + k * 0.01, "outside", eth_out() / f) for k, f in enumerate(fr)]
    frames.append((T0 + 20, "outside", udp_in(SRV1, 53, POOL1, 40000, b"still-mapped")))
    outs, rep = replay(h.make_config(), frames)
    none_of(outs, "inside", h.is_icmp, "ICMP")
    none_of(outs, "inside", lambda p: IP in p and p[IP].id == 0x7777, "fragment of an ICMP error")
    one(outs, "inside", has_payload(b"still-mapped"))
    assert rep["drops"].get("icmp_unsupported", 0) == 2, rep["drops"]
    assert rep["drops"].get("icmp_error_fragmented", 0) >= 1, rep["drops"]


def test_martians_dropped(replay):
    """Contract drop reason martian: source or destination never routed (0/8,
    127/8, multicast, broadcast), either side."""
    frames = [
        (T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"ok")),
        (T0 + 1, "inside", eth_in("0.0.0.0") / IP(src="0.0.0.0", dst="255.255.255.255", ttl=64)
         / UDP(sport=68, dport=67) / Raw(b"dhcp")),
        (T0 + 2, "inside", udp_out(SUB_A, 5353, "224.0.0.251", 5353, b"mdns")),
        (T0 + 3, "inside", udp_out(SUB_A, 40002, "127.0.0.1", 53, b"loop")),
        (T0 + 4, "outside", udp_in("127.0.0.1", 53, POOL1, 40000, b"spoof-loop")),
        (T0 + 5, "outside", udp_in("224.1.2.3", 53, POOL1, 40000, b"spoof-mcast")),
    ]
    outs, rep = replay(h.make_config(), frames)
    assert one(outs, "outside", has_payload(b"ok")).pkt[IP].src == POOL1
    assert len(outs) == 1, h.dump(outs)
    assert rep["drops"] == {"martian": 5}, rep["drops"]


def test_hairpin_respects_filtering(replay):
    """Contract: a hairpinned packet is translated as outbound and then as
    inbound, and inbound packets pass only if filtering allows (RFC 4787
    REQ-8/REQ-9). With address-and-port-dependent filtering, A's first packet
    to B's external endpoint is filtered (B never sent to A's external
    endpoint) but opens A's own filter, so B's packet to A's external endpoint
    is delivered, and A's next packet too (hairpin hole punching)."""
    cfg = h.make_config(nat={"filtering": "address-and-port-dependent"})
    frames = [
        (T0, "inside", udp_out(SUB_B, 50000, SRV1, 3478, b"b-reg")),
        (T0 + 0.1, "inside", udp_out(SUB_A, 40000, SRV1, 3478, b"a-reg")),
    ]
    outs, _ = replay(cfg, frames)
    b = one(outs, "outside", has_payload(b"b-reg")).pkt
    a = one(outs, "outside", has_payload(b"a-reg")).pkt
    b_ext, a_ext = (b[IP].src, b[UDP].sport), (a[IP].src, a[UDP].sport)
    frames += [
        (T0 + 1, "inside", udp_out(SUB_A, 40000, b_ext[0], b_ext[1], b"a-to-b-1")),
        (T0 + 2, "inside", udp_out(SUB_B, 50000, a_ext[0], a_ext[1], b"b-to-a")),
        (T0 + 3, "inside", udp_out(SUB_A, 40000, b_ext[0], b_ext[1], b"a-to-b-2")),
    ]
    outs, rep = replay(cfg, frames)
    none_of(outs, None, has_payload(b"a-to-b-1"), "hairpinned packet B never asked for")
    # A's attempt opened A's filter for B's external endpoint (hole punching)
    p = one(outs, "inside", has_payload(b"b-to-a"), "hairpinned packet A had sent towards").pkt
    assert (p[IP].src, p[UDP].sport, p[IP].dst, p[UDP].dport) == b_ext + (SUB_A, 40000)
    p = one(outs, "inside", has_payload(b"a-to-b-2"), "hairpinned packet after B sent to A").pkt
    assert (p[IP].src, p[UDP].sport, p[IP].dst, p[UDP].dport) == a_ext + (SUB_B, 50000)
    assert rep["drops"] == {"filtered": 1}, rep["drops"]


def test_paired_pooling_exhaustion_does_not_switch_address(replay):
    """RFC 4787 REQ-2 (paired) + RFC 6888 REQ-11: when the subscriber's address
    has no free port, the packet is dropped (pool_exhausted) and answered with
    ICMP host unreachable from the inside address, rather than giving the
    subscriber a second external address; another subscriber still gets a port
    on the other address."""
    cfg = h.make_config(pool=[POOL1 + "/32", "192.0.2.200/32"], nat={"ports": "5000-5001", "port_parity": False})
    frames = [(T0 + i * 0.01, "inside", udp_out(SUB_A, 40000 + i, SRV1, 53, b"a%d" % i)) for i in range(3)]
    frames.append((T0 + 1, "inside", udp_out(SUB_B, 40000, SRV1, 53, b"b0")))
    outs, rep = replay(cfg, frames)
    a0 = one(outs, "outside", has_payload(b"a0")).pkt
    a1 = one(outs, "outside", has_payload(b"a1")).pkt
    assert a0[IP].src == a1[IP].src
    none_of(outs, "outside", has_payload(b"a2"), "third mapping on a full address")
    b0 = one(outs, "outside", has_payload(b"b0")).pkt
    assert b0[IP].src != a0[IP].src
    e = one(outs, "inside", h.is_icmp_error, "ICMP error to the subscriber")
    assert icmp_info(e.pkt)[:2] == (3, 1)
    assert (e.pkt[IP].src, e.pkt[IP].dst) == (INSIDE_ADDR, SUB_A)
    assert rep["drops"] == {"pool_exhausted": 1}, rep["drops"]


def test_unsolicited_syn_to_udp_only_mapping(replay):
    """Contract: an unsolicited SYN is one with no TCP mapping at that external
    address and port; a UDP mapping on the same port does not count: the SYN
    is not forwarded and is answered with ICMP port unreachable after 6 s."""
    frames = [(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"udp"))]
    frames.append((T0 + 1, "outside", tcp_in(SRV1, 5555, POOL1, 40000, "S", seq=4242)))
    frames.append((T0 + 10, "inside", udp_out(SUB_B, 40100, SRV2, 53, b"time-passes")))
    outs, rep = replay(h.make_config(), frames)
    assert one(outs, "outside", has_payload(b"udp")).pkt[UDP].sport == 40000
    none_of(outs, "inside", h.is_tcp, "SYN to a UDP-only port")
    e = one(outs, "outside", h.is_icmp_error, "ICMP port unreachable")
    assert icmp_info(e.pkt)[:2] == (3, 3)
    assert e.ts >= T0 + 7 - 1e-6
    assert rep["drops"].get("unsolicited_syn") == 1, rep["drops"]


def test_no_time_exceeded_about_icmp_errors_fragments_or_broadcast(replay):
    """RFC 1812 sec 4.3.2.7 (and RFC 1122 sec 3.2.2): an ICMP error message
    MUST NOT be sent as the result of receiving an ICMP error message, a
    non-initial fragment, or a datagram sent as a link-layer broadcast. Such
    frames arriving with TTL 1 are dropped (ttl_expired) silently; an echo
    request with TTL 1 (a query, not an error) is still answered (control)."""
    frames = [(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"q"))]
    outs, _ = replay(h.make_config(), frames)
    emb = ip_bytes(one(outs, "outside", has_payload(b"q")).pkt)
    frag1 = h.fragment(IP(src=SUB_A, dst=SRV1, ttl=1, id=99) / UDP(sport=40000, dport=53) / Raw(b"z" * 700),
                       fragsize=304)[1]
    frames += [
        (T0 + 1, "outside", icmp_error(eth_out(), ROUTER, POOL1, emb, 3, 3, ttl=1)),
        (T0 + 2, "inside", eth_in(SUB_A) / frag1),
        (T0 + 3, "inside", icmp_error(eth_in(SUB_A), SUB_A, SRV1,
                                      bytes(IP(src=SRV1, dst=SUB_A) / UDP(sport=53, dport=40000) / b"r"), 3, 3, ttl=1)),
        (T0 + 4, "inside", Ether(src=h.mac_for(SUB_A), dst="ff:ff:ff:ff:ff:ff")
         / IP(src=SUB_A, dst=SRV1, ttl=1) / UDP(sport=40000, dport=53) / Raw(b"l2-broadcast")),
        (T0 + 5, "inside", echo_out(SUB_A, SRV1, 0x55, seq=9, ttl=1)),
    ]
    outs, rep = replay(h.make_config(), frames)
    errs = pick(outs, None, h.is_icmp_error)
    bad = [e for e in errs if abs(e.ts - (T0 + 5)) > 1e-6]
    assert not bad, "ICMP time exceeded sent about an ICMP error / non-initial fragment / link broadcast:\n" + \
        h.dump(bad)
    assert len(errs) == 1, f"the TTL-1 echo request must be answered\n{h.dump(outs)}"
    assert icmp_info(errs[0].pkt)[:2] == (11, 0)
    assert rep["drops"].get("ttl_expired", 0) >= 4, rep["drops"]
