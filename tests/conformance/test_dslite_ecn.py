"""ECN through the DS-Lite softwire (RFC 6040, RFC 3168 section 5.3), judged
by scapy.

The softwire is an IP-in-IP tunnel (RFC 6333 / RFC 2473) with the AFTR at
both of its ends towards a B4, so RFC 6040 governs its ECN field:

* Encapsulation (section 4.1, the "normal mode" every ingress must support):
  the outer header's ECN field is a copy of the inner one, CE included.
  Here the outer header is IPv6, whose ECN field is the low two bits of the
  Traffic Class.  natrix does not copy DSCP, so the outer Traffic Class is
  exactly the inner ECN value.  Every outer fragment carries that copy.

* Decapsulation (section 4.2, Figure 4): the ECN field of the packet leaving
  the tunnel is the cell at (arriving inner, arriving outer) of:

      arriving  |              arriving outer header
      inner     |  Not-ECT    ECT(0)      ECT(1)      CE
      ----------+---------------------------------------------
      Not-ECT   |  Not-ECT    Not-ECT     Not-ECT     drop
      ECT(0)    |  ECT(0)     ECT(0)      ECT(1)      CE
      ECT(1)    |  ECT(1)     ECT(1)      ECT(1)      CE
      CE        |  CE         CE          CE          CE

  In words: outer CE marks the packet CE, unless the inner transport does
  not understand ECN (Not-ECT), when it MUST be dropped instead; outer
  ECT(1) upgrades an inner ECT(0); an inner Not-ECT never leaves with an ECN
  codepoint; an inner CE is never lost.  Only the ECN bits change: the inner
  DSCP leaves as the host sent it.  natrix counts the drop as
  `dslite_ecn_not_ect_ce`.

* Outer fragments (RFC 3168 section 5.3): a CE mark on any fragment must
  survive reassembly, so a softwire packet reassembled from fragments of
  which one is CE is decapsulated as if its outer header were CE.

natrix has a fast path for established flows, so each case sends several
packets of one flow, large and small (natrix recognises the common softwire
shape by fixed offsets when the packet is large enough), and checks every one
of them.  The IPv4 packets that leave natrix have their header and transport
checksums recomputed independently (test_dslite.replay ->
natrix_harness.verify_ipv4_checksums): changing the ECN bits changes the
IPv4 header checksum but not the transport checksum.
"""

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, defragment6, fragment6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

import natrix_harness as h
from test_dslite import AFTR, B4_1, B4_MAC, HOST, POOL, SERVER, config, inner_of, outside, replay, show, to_b4

T0 = h.T0

NOT_ECT, ECT1, ECT0, CE = 0b00, 0b01, 0b10, 0b11   # RFC 3168 section 5
ECN_VALUES = (NOT_ECT, ECT0, ECT1, CE)
ECN_NAME = {NOT_ECT: "Not-ECT", ECT0: "ECT(0)", ECT1: "ECT(1)", CE: "CE"}
DROP = "drop"
DROP_REASON = "dslite_ecn_not_ect_ce"

# RFC 6040 Figure 4: row = arriving inner, columns in ECN_VALUES order =
# arriving outer (Not-ECT, ECT(0), ECT(1), CE).
RFC6040_DECAP = {
    NOT_ECT: (NOT_ECT, NOT_ECT, NOT_ECT, DROP),
    ECT0: (ECT0, ECT0, ECT1, CE),
    ECT1: (ECT1, ECT1, ECT1, CE),
    CE: (CE, CE, CE, CE),
}

# DSCP codepoints (RFC 2474 / RFC 4594), shifted into the TOS byte.
EF, AF11, AF41, CS1, CS6 = 46 << 2, 10 << 2, 34 << 2, 8 << 2, 48 << 2

# Payloads of this length make the packet large enough for the fast path
# (as in test_dslite's test_common_softwire_packets_of_any_size_are_translated_alike);
# a bare tag keeps it short.
BIG, SMALL = 60, 0

# A server port scapy dissects as nothing but Raw (53 would be decoded as DNS).
SERVER_PORT = 33333


# The cells Figure 4 marks "(!!!)": combinations no compliant encapsulator
# makes, which the decapsulator SHOULD log (section 4.2); the fourth, inner
# Not-ECT under outer CE, is the drop.  natrix counts the forwarded ones as
# the report's dslite.ecn_unexpected.
RFC6040_LOG = {(NOT_ECT, ECT0), (NOT_ECT, ECT1), (CE, ECT1)}


def decapsulated(inner, outer):
    """The ECN field RFC 6040 Figure 4 gives for this pair, or DROP."""
    return RFC6040_DECAP[inner][ECN_VALUES.index(outer)]


def ecn_id(v):
    return ECN_NAME[v]


def tagged(tag, size):
    """A payload that starts with `tag` (to find the packet among the
    outputs), padded to `size` bytes."""
    return tag + b"." * max(0, size - len(tag))


def softwire_tc(b4, inner, tc):
    """A softwire packet from `b4` with outer Traffic Class `tc`."""
    return Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / IPv6(src=b4, dst=AFTR, nh=4, tc=tc) / inner


def host_udp(tag, size=BIG, sport=5000, tos=0, tc=0, b4=B4_1):
    """A UDP packet from the host behind `b4` to the server, inner TOS `tos`."""
    inner = IP(src=HOST, dst=SERVER, tos=tos) / UDP(sport=sport, dport=SERVER_PORT) / Raw(tagged(tag, size))
    return softwire_tc(b4, inner, tc)


def server_udp(ext_port, tag, size=BIG, tos=0, total=None):
    """A reply from the server to the pool endpoint, TOS `tos`; `total`
    makes it an IPv4 packet of that total length."""
    body = tagged(tag, size if total is None else total - 28)
    return h.eth_out() / IP(src=SERVER, dst=POOL, tos=tos) / UDP(sport=SERVER_PORT, dport=ext_port) / Raw(body)


def by_tag(pkts, layer=UDP):
    """{payload tag: packet} for packets whose payload starts with one of
    our tags (a two-byte prefix, see the tests); each packet leaves once."""
    res = {}
    for p in pkts:
        if layer in p and Raw in p:
            tag = p[Raw].load[:2]
            assert tag not in res, f"{tag!r} left twice: {p.summary()}"
            res[tag] = p
    return res


def ecn_of_tos(tos):
    return tos & 0b11


def describe(tos):
    return f"TOS 0x{tos:02x} (DSCP {tos >> 2}, ECN {ECN_NAME[ecn_of_tos(tos)]})"


def external_port(replay_files, cfg, frames, layer=UDP):
    """The external port natrix gave the flow opened by `frames`."""
    outs, _ = replay(replay_files, cfg, frames)
    sent = outside(outs)
    assert sent, show(outs)
    return sent[0][layer].sport


# ---------------------------------------------------------------------------
# Decapsulation (B4 -> AFTR -> outside)
# ---------------------------------------------------------------------------

SIZES = (BIG, BIG, SMALL, BIG)


@pytest.mark.parametrize("outer", ECN_VALUES, ids=lambda v: "outer-" + ecn_id(v))
@pytest.mark.parametrize("inner", ECN_VALUES, ids=lambda v: "inner-" + ecn_id(v))
def test_decapsulation_follows_the_rfc6040_table(replay_files, inner, outer):
    """Every cell of RFC 6040 Figure 4, on two flows: flow A (port 5000)
    is opened by a packet with this combination, flow B (port 5001) by a
    plain Not-ECT packet, so the combination then arrives on an established
    flow.  Each packet leaves with the table's ECN (inner DSCP 0 kept), or,
    for an inner Not-ECT under an outer CE, is dropped and counted; the
    cells marked (!!!) are counted as ecn_unexpected, and no other."""
    want = decapsulated(inner, outer)
    frames = [(T0, "inside", host_udp(b"B-", sport=5001))]
    sent_tags = []
    for k, size in enumerate(SIZES):
        for flow, sport in ((b"A", 5000), (b"B", 5001)):
            tag = flow + str(k).encode()
            frames.append((T0 + 0.1 * (len(frames)), "inside", host_udp(tag, size, sport=sport, tos=inner, tc=outer)))
            sent_tags.append(tag)
    outs, rep = replay(replay_files, config(), frames)
    got = by_tag(outside(outs))
    assert b"B-" in got and got[b"B-"][IP].tos == 0, f"the plain opener leaves untouched\n{show(outs)}"
    if want == DROP:
        assert set(got) == {b"B-"}, f"inner Not-ECT under outer CE must be dropped (RFC 6040 4.2)\n{show(outs)}"
        assert rep["drops"] == {DROP_REASON: len(sent_tags)}, rep["drops"]
        return
    assert sorted(got) == sorted(sent_tags + [b"B-"]), show(outs)
    for tag in sent_tags:
        p = got[tag]
        assert p[IP].tos == want, (f"{tag.decode()}: inner {ECN_NAME[inner]} under outer {ECN_NAME[outer]} left with "
                                   f"{describe(p[IP].tos)}, RFC 6040 Figure 4 says {ECN_NAME[want]} (DSCP 0 kept)")
        h.verify_ipv4_checksums(bytes(p[IP]), f"{tag.decode()} leaving outside")
    assert rep["drops"] == {}, rep["drops"]
    logged = len(sent_tags) if (inner, outer) in RFC6040_LOG else 0
    assert rep["dslite"]["ecn_unexpected"] == logged, (
        f"inner {ECN_NAME[inner]} under outer {ECN_NAME[outer]}: {rep['dslite']}; Figure 4's (!!!) cells are logged")


@pytest.mark.parametrize("inner_tos,outer_tc,want_tos", [
    (EF | ECT0, CS1 | CE, EF | CE),
    (AF41 | ECT1, ECT0, AF41 | ECT1),
    (CS6 | NOT_ECT, AF11 | ECT1, CS6 | NOT_ECT),
    (AF11 | ECT0, EF | ECT1, AF11 | ECT1),
    (AF41 | CE, CS6 | NOT_ECT, AF41 | CE),
], ids=["EF-ECT0-under-CS1-CE", "AF41-ECT1-under-ECT0", "CS6-NotECT-under-AF11-ECT1", "AF11-ECT0-under-EF-ECT1",
        "AF41-CE-under-CS6-NotECT"])
def test_decapsulation_changes_only_the_ecn_bits_and_keeps_the_inner_dscp(replay_files, inner_tos, outer_tc, want_tos):
    """RFC 6040 defines the ECN field only; the inner DSCP leaves as the
    host set it, and the outer DSCP (whatever a network on the way to the
    AFTR wrote) is not copied into it."""
    frames = [(T0 + 0.1 * k, "inside", host_udp(b"D" + str(k).encode(), size, tos=inner_tos, tc=outer_tc))
              for k, size in enumerate(SIZES)]
    outs, rep = replay(replay_files, config(), frames)
    got = by_tag(outside(outs))
    assert len(got) == len(frames), show(outs)
    for tag, p in sorted(got.items()):
        assert p[IP].tos == want_tos, f"{tag.decode()}: left with {describe(p[IP].tos)}, expected {describe(want_tos)}"
    assert rep["drops"] == {}, rep["drops"]


def test_not_ect_under_ce_is_dropped_on_an_established_flow_and_the_flow_goes_on(replay_files):
    """The drop of RFC 6040 4.2 concerns that packet only: the flow's
    packets before and after it (with a harmless outer field) get through."""
    frames = [
        (T0, "inside", host_udp(b"o0")),
        (T0 + 0.1, "inside", host_udp(b"o1", tc=ECT0)),
        (T0 + 0.2, "inside", host_udp(b"x0", tc=CE)),
        (T0 + 0.3, "inside", host_udp(b"x1", SMALL, tc=CE)),
        (T0 + 0.4, "inside", host_udp(b"o2", tc=ECT1)),
        (T0 + 0.5, "inside", host_udp(b"x2", tc=CE)),
        (T0 + 0.6, "inside", host_udp(b"o3")),
    ]
    outs, rep = replay(replay_files, config(), frames)
    got = by_tag(outside(outs))
    assert sorted(got) == [b"o0", b"o1", b"o2", b"o3"], show(outs)
    assert all(p[IP].tos == NOT_ECT for p in got.values()), "an inner Not-ECT never leaves with an ECN codepoint"
    assert rep["drops"] == {DROP_REASON: 3}, rep["drops"]


def host_tcp(tag, size, sport, seq, flags="A", tos=0, tc=0):
    inner = IP(src=HOST, dst=SERVER, tos=tos) / TCP(sport=sport, dport=80, flags=flags, seq=seq, ack=10, window=65535)
    if tag is not None:
        inner = inner / Raw(tagged(tag, size))
    return softwire_tc(B4_1, inner, tc)


def test_tcp_segments_leave_with_the_combined_ecn_and_a_recomputed_header_checksum(replay_files):
    """A TCP connection through the softwire whose data segments carry
    ECN (RFC 3168 section 6.1.1: not the SYN): under an outer CE they leave
    CE, under an outer ECT(1) an inner ECT(0) leaves ECT(1).  The ECN bits
    are in the IPv4 header checksum but not in the TCP pseudo-header, so the
    header checksum must be recomputed and the TCP checksum stays valid;
    both are verified independently."""
    cfg = config(dslite='mss_clamp = "off"\n')
    syn = host_tcp(None, 0, 40000, seq=1, flags="S")
    frames = [(T0, "inside", syn)]
    ext = external_port(replay_files, cfg, frames, layer=TCP)
    synack = h.eth_out() / IP(src=SERVER, dst=POOL) / TCP(sport=80, dport=ext, flags="SA", seq=9, ack=2, window=65535)
    frames.append((T0 + 0.1, "outside", synack))
    cases = [  # (tag, size, inner, outer)
        (b"t0", BIG, ECT0, CE),
        (b"t1", BIG, ECT1, CE),
        (b"t2", SMALL, ECT0, CE),
        (b"t3", BIG, ECT0, ECT1),
        (b"t4", BIG, CE, NOT_ECT),
        (b"t5", BIG, ECT0, CE),
    ]
    seq = 2
    for k, (tag, size, inner, outer) in enumerate(cases):
        frames.append((T0 + 0.2 + 0.1 * k, "inside", host_tcp(tag, size, 40000, seq, flags="PA", tos=inner, tc=outer)))
        seq += max(size, len(tag))
    outs, rep = replay(replay_files, cfg, frames)
    got = by_tag(outside(outs), layer=TCP)
    assert len(got) == len(cases), show(outs)
    for tag, _size, inner, outer in cases:
        p = got[tag]
        want = decapsulated(inner, outer)
        assert p[TCP].sport == ext, p.summary()
        assert p[IP].tos == want, f"{tag.decode()}: inner {ECN_NAME[inner]} under outer {ECN_NAME[outer]} left with {describe(p[IP].tos)}"
        h.verify_ipv4_checksums(bytes(p[IP]), f"TCP segment {tag.decode()} leaving outside")
    assert rep["drops"] == {}, rep["drops"]


# ---------------------------------------------------------------------------
# Encapsulation (outside -> AFTR -> B4)
# ---------------------------------------------------------------------------


def opened_flow(replay_files):
    """Frames opening the host's UDP flow, and the external port it got."""
    frames = [(T0, "inside", host_udp(b"q0"))]
    return frames, external_port(replay_files, config(), frames)


def check_outer_tc(pkt, ecn, where):
    tc = pkt[IPv6].tc
    assert ecn_of_tos(tc) == ecn, f"{where}: outer ECN {ECN_NAME[ecn_of_tos(tc)]}, RFC 6040 4.1 copies the inner {ECN_NAME[ecn]}"
    assert tc >> 2 == 0, f"{where}: outer DSCP {tc >> 2}, natrix does not copy DSCP (traffic class = ECN only)"


@pytest.mark.parametrize("ecn", ECN_VALUES, ids=ecn_id)
def test_encapsulation_copies_the_inner_ecn_into_the_outer_traffic_class(replay_files, ecn):
    """RFC 6040 4.1 normal mode: the outer ECN is a copy of the inner one,
    CE included; the inner packet keeps its TOS byte (DSCP and ECN); the
    outer DSCP stays 0 even when the inner one is not."""
    frames, port = opened_flow(replay_files)
    replies = [(b"r0", BIG, ecn), (b"r1", SMALL, ecn), (b"r2", BIG, AF11 | ecn), (b"r3", BIG, ecn), (b"r4", SMALL, EF | ecn)]
    for k, (tag, size, tos) in enumerate(replies):
        frames.append((T0 + 1 + 0.1 * k, "outside", server_udp(port, tag, size, tos=tos)))
    outs, rep = replay(replay_files, config(), frames)
    back = to_b4(outs, B4_1)
    assert len(back) == len(replies), show(outs)
    got = {bytes(inner_of(p)[Raw].load[:2]): p for p in back}
    for tag, _size, tos in replies:
        p = got[tag]
        check_outer_tc(p, ecn, tag.decode())
        assert inner_of(p).tos == tos, f"{tag.decode()}: inner {describe(inner_of(p).tos)}, sent {describe(tos)}"
    assert rep["drops"] == {}, rep["drops"]


@pytest.mark.parametrize("ecn", ECN_VALUES, ids=ecn_id)
def test_every_outer_fragment_carries_the_copied_ecn(replay_files, ecn):
    """A reply without DF too large for the softwire MTU leaves as outer
    IPv6 fragments (as in test_dslite's
    test_without_df_the_outer_packet_is_fragmented_towards_the_b4); each
    fragment is an outer header of the tunnel and carries the copy, so a CE
    mark is not lost whichever fragment a B4 looks at (RFC 3168 5.3 at the
    B4's reassembly).  Two such replies, then a small one on the same flow."""
    frames, port = opened_flow(replay_files)
    frames += [
        (T0 + 1, "outside", server_udp(port, b"f0", total=1480, tos=ecn)),
        (T0 + 1.1, "outside", server_udp(port, b"f1", total=1480, tos=AF41 | ecn)),
        (T0 + 1.2, "outside", server_udp(port, b"s2", SMALL, tos=ecn)),
    ]
    outs, rep = replay(replay_files, config(), frames)
    back = to_b4(outs, B4_1)
    frags = [p for p in back if IPv6ExtHdrFragment in p]
    whole = [p for p in back if IPv6ExtHdrFragment not in p]
    assert len(frags) == 4 and len(whole) == 1, show(outs)
    for k, p in enumerate(frags):
        check_outer_tc(p, ecn, f"outer fragment #{k}")
    groups = {}
    for p in frags:
        groups.setdefault(p[IPv6ExtHdrFragment].id, []).append(p[IPv6].copy())
    assert len(groups) == 2, show(outs)
    for (_ident, parts), tos in zip(sorted(groups.items()), (ecn, AF41 | ecn)):
        i = IP(bytes(defragment6(parts)[IPv6].payload))
        h.verify_ipv4_checksums(bytes(i), "reassembled inner packet")
        assert (i.dst, i[UDP].dport, i.len, i.tos) == (HOST, 5000, 1480, tos), i.summary()
    check_outer_tc(whole[0], ecn, "the small reply after them")
    assert rep["drops"] == {}, rep["drops"]


# ---------------------------------------------------------------------------
# Outer fragments from a B4 (RFC 3168 section 5.3)
# ---------------------------------------------------------------------------

BULK = bytes(range(256)) * 6


def fragmented_from_b4(inner_tos, tcs, ident=0x1234, reverse=False):
    """A softwire packet whose IPv4 packet (UDP, 1564 bytes)
    arrives in len(tcs) outer fragments, fragment k with Traffic Class
    tcs[k] (in offset order); `reverse` delivers them last first."""
    inner = IP(src=HOST, dst=SERVER, tos=inner_tos, id=7) / UDP(sport=5000, dport=SERVER_PORT) / Raw(BULK)
    frags = fragment6(IPv6(src=B4_1, dst=AFTR) / IPv6ExtHdrFragment(id=ident, nh=4) / inner, 600)
    assert len(frags) == len(tcs), f"{len(frags)} fragments"
    for f, tc in zip(frags, tcs):
        f[IPv6].tc = tc
    frames = [Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / f for f in frags]
    return list(reversed(frames)) if reverse else frames


def replay_fragmented(replay_files, fragments, opener=True):
    """Runs: [a plain packet opening the flow], the fragments, then a packet
    of the same flow with inner ECT(0) under outer ECT(0), which must leave
    ECT(0): a CE seen on the fragments must not stick to the flow.
    Returns (the reassembled packet leaving outside or None, outs, report)."""
    frames = [(T0, "inside", host_udp(b"o0"))] if opener else []
    frames += [(T0 + 1 + 0.01 * k, "inside", f) for k, f in enumerate(fragments)]
    frames.append((T0 + 2, "inside", host_udp(b"z0", tos=ECT0, tc=ECT0)))
    outs, rep = replay(replay_files, config(), frames)
    sent = outside(outs)
    got = by_tag(sent)
    assert b"z0" in got and got[b"z0"][IP].tos == ECT0, f"the packet after the fragments\n{show(outs)}"
    if opener:
        assert b"o0" in got and got[b"o0"][IP].tos == NOT_ECT, show(outs)
    big = [p for p in sent if Raw in p and p[Raw].load == BULK]
    assert len(big) <= 1, show(outs)
    return (big[0] if big else None), outs, rep


@pytest.mark.parametrize("reverse", [False, True], ids=["in-order", "last-first"])
@pytest.mark.parametrize("ce_index", [0, 1, 2], ids=["CE-first", "CE-middle", "CE-last"])
def test_one_ce_outer_fragment_makes_the_reassembled_packet_ce(replay_files, ce_index, reverse):
    """RFC 3168 5.3: fragments ECT(0) but one CE -> the reassembled outer
    packet is CE; with inner ECT(0), RFC 6040 then gives CE."""
    tcs = [ECT0, ECT0, ECT0]
    tcs[ce_index] = CE
    p, outs, rep = replay_fragmented(replay_files, fragmented_from_b4(ECT0, tcs, reverse=reverse))
    assert p is not None, show(outs)
    assert p[IP].tos == CE, f"fragments {[ECN_NAME[t] for t in tcs]}: left with {describe(p[IP].tos)}, expected CE"
    assert (rep["dslite"]["reassembled"], rep["drops"]) == (1, {}), (rep["dslite"], rep["drops"])


def test_a_reassembled_packet_that_opens_its_flow_is_marked_too(replay_files):
    """As above with CE on the last fragment only, the reassembled packet
    being the flow's first packet."""
    p, outs, rep = replay_fragmented(replay_files, fragmented_from_b4(ECT1, [ECT0, ECT0, CE]), opener=False)
    assert p is not None, show(outs)
    assert p[IP].tos == CE, describe(p[IP].tos)
    assert rep["drops"] == {}, rep["drops"]


@pytest.mark.parametrize("inner,tc", [(ECT0, ECT1), (CE, NOT_ECT), (ECT1, ECT0), (ECT0, NOT_ECT), (NOT_ECT, CE)],
                         ids=["ECT0-in-ECT1", "CE-in-NotECT", "ECT1-in-ECT0", "ECT0-in-NotECT", "NotECT-in-CE"])
def test_uniform_outer_fragments_combine_like_an_unfragmented_packet(replay_files, inner, tc):
    """Fragments all carrying the same ECN reassemble into a packet with
    that outer ECN, which then combines with the inner one by RFC 6040's
    table; all CE over an inner Not-ECT is dropped and counted."""
    want = decapsulated(inner, tc)
    p, outs, rep = replay_fragmented(replay_files, fragmented_from_b4(inner, [tc, tc, tc]))
    if want == DROP:
        assert p is None, f"inner Not-ECT reassembled from CE fragments must be dropped, left as {describe(p[IP].tos)}"
        assert set(rep["drops"]) == {DROP_REASON}, rep["drops"]
        return
    assert p is not None, show(outs)
    assert p[IP].tos == want, f"inner {ECN_NAME[inner]} in fragments all {ECN_NAME[tc]}: left with {describe(p[IP].tos)}"
    assert rep["drops"] == {}, rep["drops"]


@pytest.mark.parametrize("ecn", ECN_VALUES, ids=ecn_id)
def test_compatibility_mode_writes_not_ect_outside_and_still_carries_marks_in(replay_files, ecn):
    """RFC 6040 4.1's compatibility mode (`[dslite] ecn = "compatibility"`),
    for B4s that would not carry an outer mark in: the outer header is
    Not-ECT whatever the inner packet's ECN field, which the inner packet
    keeps; decapsulation still follows figure 4 (CE outside marks ECT
    inside)."""
    cfg = config(dslite='ecn = "compatibility"\n')
    frames, port = opened_flow(replay_files)
    frames += [(T0 + 1, "outside", server_udp(port, b"c0", BIG, tos=ecn)), (T0 + 1.1, "outside", server_udp(port, b"c1", SMALL, tos=AF11 | ecn))]
    frames += [(T0 + 2, "inside", host_udp(b"u0", tos=ECT0, tc=CE))]
    outs, rep = replay(replay_files, cfg, frames)
    back = to_b4(outs, B4_1)
    assert len(back) == 2, show(outs)
    for p in back:
        check_outer_tc(p, NOT_ECT, "compatibility mode")
        assert ecn_of_tos(inner_of(p).tos) == ecn, "the inner packet keeps its own ECN field"
    marked = [p for p in outside(outs) if bytes(p[Raw].load[:2]) == b"u0"]
    assert len(marked) == 1 and ecn_of_tos(marked[0][IP].tos) == CE, show(outs)
    assert rep["drops"] == {}, rep["drops"]


def test_check_config_names_a_bad_ecn_mode(natrix, tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(config(dslite='ecn = "lossy"\n'))
    proc = natrix("check-config", str(p))
    assert proc.returncode == 2 and "dslite.ecn" in h.proc_text(proc), h.proc_text(proc)
    p.write_text(config(dslite='ecn = "compatibility"\n'))
    assert natrix("check-config", str(p)).returncode == 0
