"""Router behaviour (CONTRACTS.md "Wave 2: shared rules"): IPv6 routed in every
mode (no `address6` needed in replay), IPv6 hop limit and ICMPv6 time exceeded
(RFC 4443 sections 2.4 and 3.3), `[nat] mode = "off"` (IPv4 routed untranslated,
RFC 1812 / RFC 792 TTL handling) and determinism of both.

Written from the contract and the RFCs, not from natrix's source. IPv6 output
is read from the pcapng here (the harness's decode_outputs is IPv4 only) and
every IPv6 checksum is recomputed independently (pseudo-header, RFC 8200
section 8.1, summed with scapy's checksum()).
"""

import ipaddress
import json
import struct

import pytest
from scapy.layers.inet6 import (
    ICMPv6DestUnreach,
    ICMPv6EchoReply,
    ICMPv6EchoRequest,
    ICMPv6TimeExceeded,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrHopByHop,
    PadN,
)
from scapy.utils import checksum

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, INSIDE_ADDR, SRV1, SUB_A, T0, TCP, UDP, Ether, Raw, icmp_info, one, pick,
)

# ---------------------------------------------------------------------------
# Addresses and configs
# ---------------------------------------------------------------------------

H6_IN = "fd00:1::10"            # an IPv6 host behind natrix (inside)
H6_OUT = "2001:db8:200::20"     # an IPv6 server on the internet (outside)
ADDR6_IN = "fd00:1::1"          # [inside] address6 when configured
ADDR6_OUT = "2001:db8:ff::1"    # [outside] address6 when configured
LINK_LOCAL = "fe80::1"          # contract: the source when the side has no address6
OUTSIDE_ADDR = "198.51.100.1"   # [outside] address in router-mode tests

MIN_MTU6 = 1280                 # RFC 8200 minimum link MTU

CFG_NAPT44 = h.make_config()
CFG_OFF = '[nat]\nmode = "off"\n'
CFG_OFF_OUT = f'[outside]\naddress = "{OUTSIDE_ADDR}/24"\n[nat]\nmode = "off"\n'
CFG_DETERMINISTIC = (
    '[nat]\nmode = "deterministic"\nsubscribers = ["100.64.0.0/22"]\n'
    'ports_per_subscriber = 1008\npool = ["203.0.113.0/28"]\nports = "1024-65535"\n'
)
MODES = {"napt44": CFG_NAPT44, "off": CFG_OFF, "deterministic": CFG_DETERMINISTIC}


def cfg_with(base_nat, inside=None, outside=None):
    """A config: optional [inside]/[outside] sections, then the [nat] text."""
    text = ""
    if inside:
        text += "[inside]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in inside.items())
    if outside:
        text += "[outside]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in outside.items())
    return text + base_nat


NAT_NAPT44 = '[nat]\npool = ["203.0.113.1/32"]\n'

# ---------------------------------------------------------------------------
# Frame builders
# ---------------------------------------------------------------------------

H6_IN_MAC = "02:10:00:00:00:10"


def eth6_in(dst_mac=h.NAT_IN_MAC):
    return Ether(src=H6_IN_MAC, dst=dst_mac, type=0x86DD)


def eth6_out(dst_mac=h.NAT_OUT_MAC):
    return Ether(src=h.GW_MAC, dst=dst_mac, type=0x86DD)


def udp6_in(payload=b"v6-out", hlim=64, src=H6_IN, dst=H6_OUT, ext=(), sport=40000, dport=53,
            dst_mac=h.NAT_IN_MAC):
    """IPv6/UDP arriving inside (from an inside host towards the internet)."""
    p = IPv6(src=src, dst=dst, hlim=hlim, fl=0x12345, tc=0x28)
    for e in ext:
        p = p / e
    return bytes(eth6_in(dst_mac) / p / UDP(sport=sport, dport=dport) / Raw(payload))


def udp6_out(payload=b"v6-in", hlim=64, src=H6_OUT, dst=H6_IN, ext=(), sport=53, dport=40000,
             dst_mac=h.NAT_OUT_MAC):
    """IPv6/UDP arriving outside (from the internet towards an inside host)."""
    p = IPv6(src=src, dst=dst, hlim=hlim, fl=0xABCDE)
    for e in ext:
        p = p / e
    return bytes(eth6_out(dst_mac) / p / UDP(sport=sport, dport=dport) / Raw(payload))


def hbh():
    return IPv6ExtHdrHopByHop(options=[PadN(optdata=b"\x00" * 4)])


def dstopt():
    return IPv6ExtHdrDestOpt(options=[PadN(optdata=b"\x00" * 12)])


# ---------------------------------------------------------------------------
# Reading and verifying output (IPv4 and IPv6)
# ---------------------------------------------------------------------------

EXT_HDRS = (0, 43, 60)  # hop-by-hop, routing, destination options


def l3_offset(raw: bytes):
    """(ethertype, offset of the L3 header) of an Ethernet frame, VLAN aware."""
    off = 12
    et = struct.unpack("!H", raw[off:off + 2])[0]
    off += 2
    while et in (0x8100, 0x88A8, 0x9100):
        et = struct.unpack("!H", raw[off + 2:off + 4])[0]
        off += 4
    return et, off


def ipv6_of(raw: bytes) -> bytes:
    et, off = l3_offset(raw)
    assert et == 0x86DD, f"not an IPv6 frame: {raw[:40].hex()}"
    ipb = raw[off:]
    plen = struct.unpack("!H", ipb[4:6])[0]
    return ipb[:40 + plen]


def upper_layer6(ipb: bytes):
    """(next header, offset, fragmented) of the upper-layer header of an IPv6 packet."""
    nh, off = ipb[6], 40
    frag = False
    while True:
        if nh in EXT_HDRS:
            assert off + 2 <= len(ipb), "IPv6 extension header truncated"
            nh, off = ipb[off], off + (ipb[off + 1] + 1) * 8
        elif nh == 44:
            fo = struct.unpack("!H", ipb[off + 2:off + 4])[0]
            frag = frag or (fo & 0xFFF9) != 0
            nh, off = ipb[off], off + 8
        else:
            return nh, off, frag


def l4_checksum6_ok(ipb: bytes, nh: int, seg: bytes) -> bool:
    pseudo = ipb[8:24] + ipb[24:40] + struct.pack("!I", len(seg)) + b"\x00\x00\x00" + bytes([nh])
    return checksum(pseudo + seg) == 0


def verify_ipv6(ipb: bytes, where: str):
    assert len(ipb) >= 40 and ipb[0] >> 4 == 6, f"{where}: not IPv6"
    plen = struct.unpack("!H", ipb[4:6])[0]
    assert len(ipb) == 40 + plen, f"{where}: payload length {plen} but {len(ipb) - 40} bytes"
    nh, off, frag = upper_layer6(ipb)
    if frag:
        return
    seg = ipb[off:]
    if nh == 17:
        assert len(seg) >= 8, f"{where}: UDP header truncated"
        assert struct.unpack("!H", seg[6:8])[0] != 0, f"{where}: zero UDP checksum over IPv6"
        assert l4_checksum6_ok(ipb, 17, seg), f"{where}: bad UDP checksum"
    elif nh == 6:
        assert len(seg) >= 20, f"{where}: TCP header truncated"
        assert l4_checksum6_ok(ipb, 6, seg), f"{where}: bad TCP checksum"
    elif nh == 58:
        assert len(seg) >= 8, f"{where}: ICMPv6 header truncated"
        assert l4_checksum6_ok(ipb, 58, seg), f"{where}: bad ICMPv6 checksum"


def verify_output(recs):
    for i, (_ts, side, raw) in enumerate(recs):
        where = f"output frame #{i} ({side})"
        et, off = l3_offset(raw)
        if et == 0x0800:
            h.verify_ipv4_checksums(raw[off:], where)
        elif et == 0x86DD:
            verify_ipv6(ipv6_of(raw), where)
        else:
            raise AssertionError(f"{where}: unexpected ethertype 0x{et:04x}")


def run6(replay_files, config, frames):
    """Replay ``frames`` [(ts, side, bytes)]; returns ([(ts, side, raw)], report),
    every output checksum (IPv4 and IPv6) verified."""
    proc, d = replay_files(config, frames)
    assert proc.returncode == 0, f"natrix replay exited {proc.returncode}\nconfig:\n{config}\n{h.proc_text(proc)}"
    recs = h.check_output_capture(d / "out.pcapng")
    verify_output(recs)
    report = json.loads((d / "r.json").read_text())
    return recs, report


def show(recs):
    lines = []
    for ts, side, raw in recs:
        lines.append(f"  {ts:.6f} {side:7s} {Ether(raw).summary()}")
    return "\n".join(lines) or "  (no output frames)"


def check_counts(rep, **want):
    got = {k: rep["packets"][k] for k in want}
    assert got == want, f"report packets {rep['packets']}, drops {rep['drops']}; expected {want}"


def check_forwarded6(rec, trigger: bytes, side: str):
    """The routed frame: same Ethernet header, IPv6 packet byte-identical except
    the hop limit, one lower."""
    _ts, s, raw = rec
    assert s == side, f"left on {s}, expected {side}"
    assert raw[:14] == trigger[:14], "Ethernet header changed"
    got, sent = ipv6_of(raw), ipv6_of(trigger)
    assert got[7] == sent[7] - 1, f"hop limit {sent[7]} left as {got[7]}, expected {sent[7] - 1}"
    assert got[:7] == sent[:7] and got[8:] == sent[8:], (
        "routed IPv6 packet changed beyond the hop limit:\n"
        f" sent {sent.hex()}\n got  {got.hex()}")


def check_time_exceeded6(rec, trigger: bytes, side: str, src: str):
    """RFC 4443 section 3.3: type 3 code 0, to the offending packet's source,
    unused field zero, quoting as much of the offending packet (from its IPv6
    header, as received) as fits in 1280 bytes; checksum verified in
    verify_output. Contract: generated frames swap the trigger's Ethernet
    addresses."""
    _ts, s, raw = rec
    assert s == side, f"time exceeded left on {s}, expected {side}"
    assert raw[0:6] == trigger[6:12] and raw[6:12] == trigger[0:6], \
        "generated frame must carry the trigger's Ethernet addresses swapped"
    ipb = ipv6_of(raw)
    sent = ipv6_of(trigger)
    assert ipaddress.ip_address(ipb[8:24]) == ipaddress.ip_address(src), \
        f"source {ipaddress.ip_address(ipb[8:24])}, expected {src}"
    assert ipb[24:40] == sent[8:24], \
        f"destination {ipaddress.ip_address(ipb[24:40])}, expected the offender's source"
    nh, off, _ = upper_layer6(ipb)
    assert nh == 58, f"next header {nh}, expected ICMPv6"
    icmp = ipb[off:]
    assert (icmp[0], icmp[1]) == (3, 0), f"ICMPv6 type/code {icmp[0]}/{icmp[1]}, expected 3/0"
    assert icmp[4:8] == b"\x00\x00\x00\x00", "unused field must be zero"
    assert len(ipb) <= MIN_MTU6, f"ICMPv6 error is {len(ipb)} bytes, over the minimum MTU {MIN_MTU6}"
    quote = icmp[8:]
    want = min(len(sent), MIN_MTU6 - off - 8)
    assert len(quote) == want, f"quoted {len(quote)} bytes, expected {want} (as much as fits in {MIN_MTU6})"
    assert quote == sent[:want], "quote is not the offending packet as received, from its IPv6 header on"


# ---------------------------------------------------------------------------
# 1. IPv6 routed in every mode
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("direction", ["in2out", "out2in"])
def test_ipv6_udp_routed(replay_files, mode, direction):
    """Contract: "IPv6 that no configured function claims is routed, in every
    mode", and replay needs no address6 for it. The frame leaves on the other
    side with its hop limit one lower and every other byte of the IPv6 packet
    (traffic class, flow label, addresses, payload, UDP checksum) unchanged,
    and the report counts it as forwarded."""
    if direction == "in2out":
        f, arrive, leave = udp6_in(b"v6-routed-out"), "inside", "outside"
    else:
        f, arrive, leave = udp6_out(b"v6-routed-in"), "outside", "inside"
    recs, rep = run6(replay_files, MODES[mode], [(T0, arrive, f)])
    assert len(recs) == 1, show(recs)
    check_forwarded6(recs[0], f, leave)
    assert abs(recs[0][0] - T0) < 1e-6
    check_counts(rep, **{"in": 1, f"in_{arrive}": 1, "out": 1, f"out_{leave}": 1,
                         "generated": 0, "dropped": 0})
    assert rep["drops"] == {}, rep["drops"]


@pytest.mark.parametrize("ext", [[hbh], [dstopt], [hbh, dstopt]], ids=["hop-by-hop", "dest-opts", "both"])
@pytest.mark.parametrize("direction", ["in2out", "out2in"])
def test_ipv6_extension_headers_routed(replay_files, ext, direction):
    """A Hop-by-Hop and/or Destination Options header before UDP (RFC 8200
    section 4) does not stop routing; the packet, extension headers included,
    is unchanged but for the hop limit (default NAPT44 config)."""
    hdrs = [e() for e in ext]
    if direction == "in2out":
        f, arrive, leave = udp6_in(b"ext-out", ext=hdrs), "inside", "outside"
    else:
        f, arrive, leave = udp6_out(b"ext-in", ext=hdrs), "outside", "inside"
    recs, rep = run6(replay_files, CFG_NAPT44, [(T0, arrive, f)])
    assert len(recs) == 1, show(recs)
    check_forwarded6(recs[0], f, leave)
    check_counts(rep, **{f"out_{leave}": 1, "dropped": 0, "generated": 0})


def test_ipv6_tcp_and_icmpv6_echo_routed(replay_files):
    """TCP and ICMPv6 echo are routed both ways as well, untouched but for the
    hop limit (default NAPT44 config)."""
    syn = bytes(eth6_in() / IPv6(src=H6_IN, dst=H6_OUT, hlim=64)
                / TCP(sport=40001, dport=443, flags="S", seq=1000, window=65535))
    synack = bytes(eth6_out() / IPv6(src=H6_OUT, dst=H6_IN, hlim=57)
                   / TCP(sport=443, dport=40001, flags="SA", seq=9000, ack=1001, window=65535))
    ping = bytes(eth6_in() / IPv6(src=H6_IN, dst=H6_OUT, hlim=2) / ICMPv6EchoRequest(id=7, seq=1, data=b"p6"))
    pong = bytes(eth6_out() / IPv6(src=H6_OUT, dst=H6_IN, hlim=64) / ICMPv6EchoReply(id=7, seq=1, data=b"p6"))
    frames = [(T0, "inside", syn), (T0 + 0.1, "outside", synack),
              (T0 + 0.2, "inside", ping), (T0 + 0.3, "outside", pong)]
    recs, rep = run6(replay_files, CFG_NAPT44, frames)
    assert len(recs) == 4, show(recs)
    recs.sort(key=lambda r: r[0])
    for rec, (_ts, arrive, f) in zip(recs, frames):
        check_forwarded6(rec, f, "outside" if arrive == "inside" else "inside")
    check_counts(rep, **{"in": 4, "out": 4, "out_inside": 2, "out_outside": 2, "generated": 0, "dropped": 0})


# ---------------------------------------------------------------------------
# 2. Hop limit and ICMPv6 time exceeded
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("hlim", [1, 0])
@pytest.mark.parametrize("address6", [None, ADDR6_IN + "/64"], ids=["no-address6", "address6"])
def test_hop_limit_expired_inside(replay_files, hlim, address6):
    """Contract / RFC 4443 section 3.3: an IPv6 packet arriving inside with hop
    limit 1 (or 0) is not forwarded, is counted as `ttl_expired`, and is
    answered on the inside with ICMPv6 time exceeded (3/0) from `[inside]
    address6`, or fe80::1 when there is none."""
    cfg = cfg_with(NAT_NAPT44, inside={"address6": address6} if address6 else None)
    f = udp6_in(b"hl-expired", hlim=hlim)
    recs, rep = run6(replay_files, cfg, [(T0, "inside", f)])
    assert len(recs) == 1, "expected only the time exceeded:\n" + show(recs)
    check_time_exceeded6(recs[0], f, "inside", ADDR6_IN if address6 else LINK_LOCAL)
    assert rep["drops"] == {"ttl_expired": 1}, rep["drops"]
    check_counts(rep, **{"in": 1, "out": 1, "out_inside": 1, "out_outside": 0, "generated": 1, "dropped": 1})


@pytest.mark.parametrize("address6", [None, ADDR6_OUT + "/64"], ids=["no-address6", "address6"])
def test_hop_limit_expired_outside(replay_files, address6):
    """Arriving outside (here an ICMPv6 echo request with hop limit 1, which as
    an informational message gets an error like any other packet): the time
    exceeded leaves outside, from `[outside] address6` or fe80::1."""
    cfg = cfg_with(NAT_NAPT44, outside={"address6": address6} if address6 else None)
    f = bytes(eth6_out() / IPv6(src=H6_OUT, dst=H6_IN, hlim=1) / ICMPv6EchoRequest(id=9, seq=3, data=b"hl-out"))
    recs, rep = run6(replay_files, cfg, [(T0, "outside", f)])
    assert len(recs) == 1, "expected only the time exceeded:\n" + show(recs)
    check_time_exceeded6(recs[0], f, "outside", ADDR6_OUT if address6 else LINK_LOCAL)
    assert rep["drops"] == {"ttl_expired": 1}, rep["drops"]
    check_counts(rep, **{"out_outside": 1, "out_inside": 0, "generated": 1})


def test_time_exceeded_quote_fits_minimum_mtu(replay_files):
    """RFC 4443 section 3.3: "as much of invoking packet as possible without the
    ICMPv6 packet exceeding the minimum IPv6 MTU": a 1448-byte offender (1400
    bytes of UDP payload) gives an error of exactly 1280 bytes whose quote is
    the offender's first 1232 bytes. Both sides, with and without address6."""
    big = bytes(range(256)) * 5 + b"x" * 120
    assert len(big) == 1400
    f_in = udp6_in(big, hlim=1)
    f_out = udp6_out(big, hlim=1)
    for cfg, src_in, src_out in [
        (CFG_NAPT44, LINK_LOCAL, LINK_LOCAL),
        (cfg_with(NAT_NAPT44, inside={"address6": ADDR6_IN + "/64"}, outside={"address6": ADDR6_OUT + "/64"}),
         ADDR6_IN, ADDR6_OUT),
    ]:
        recs, rep = run6(replay_files, cfg, [(T0, "inside", f_in), (T0 + 1, "outside", f_out)])
        assert len(recs) == 2, show(recs)
        recs.sort(key=lambda r: r[0])
        check_time_exceeded6(recs[0], f_in, "inside", src_in)
        check_time_exceeded6(recs[1], f_out, "outside", src_out)
        for r in recs:
            assert len(ipv6_of(r[2])) == MIN_MTU6
        assert rep["drops"] == {"ttl_expired": 2}, rep["drops"]


def _quoted(pkt):
    return bytes(pkt)[14:]


NO_ERROR_CASES = {
    # RFC 4443 2.4 (e.3): a packet sent as a link-layer multicast / broadcast
    "eth-broadcast": lambda: udp6_in(b"bcast", hlim=1, dst_mac="ff:ff:ff:ff:ff:ff"),
    "eth-multicast": lambda: udp6_in(b"mcast", hlim=1, dst_mac="33:33:00:00:00:20"),
    # RFC 4443 2.4 (e.2): destined to an IPv6 multicast address
    "ipv6-multicast-dst": lambda: udp6_in(b"mdst", hlim=1, dst="ff0e::20"),
    # RFC 4443 2.4 (e.6): source that does not uniquely identify a node
    "multicast-src": lambda: udp6_in(b"msrc", hlim=1, src="ff0e::10"),
    "unspecified-src": lambda: udp6_in(b"usrc", hlim=1, src="::"),
    # RFC 4443 2.4 (e.1): an ICMPv6 error message
    "icmpv6-dest-unreach": lambda: bytes(
        eth6_in() / IPv6(src=H6_IN, dst=H6_OUT, hlim=1) / ICMPv6DestUnreach(code=4)
        / Raw(_quoted(udp6_out(b"orig", hlim=50)))),
    "icmpv6-time-exceeded": lambda: bytes(
        eth6_in() / IPv6(src=H6_IN, dst=H6_OUT, hlim=1) / ICMPv6TimeExceeded(code=0)
        / Raw(_quoted(udp6_out(b"orig2", hlim=1)))),
}


@pytest.mark.parametrize("case", list(NO_ERROR_CASES))
def test_no_time_exceeded_for(replay_files, case):
    """RFC 4443 section 2.4 (e): no ICMPv6 error about an ICMPv6 error, about a
    packet to a multicast address or sent as a link-layer multicast or
    broadcast, or about a packet whose source is multicast or unspecified. The
    hop-limit-1 packet is not forwarded either: it is dropped (under whatever
    reason, `ttl_expired` or `martian`) and nothing at all leaves."""
    f = NO_ERROR_CASES[case]()
    recs, rep = run6(replay_files, cfg_with(NAT_NAPT44, inside={"address6": ADDR6_IN + "/64"}),
                     [(T0, "inside", f)])
    assert recs == [], f"{case}: expected no output at all:\n" + show(recs)
    check_counts(rep, **{"in": 1, "out": 0, "generated": 0, "dropped": 1})


# ---------------------------------------------------------------------------
# 3. [nat] mode = "off": IPv4 routed untranslated
# ---------------------------------------------------------------------------


def _check_routed4(o, trigger, side):
    """Same Ethernet header, IPv4 packet unchanged but for TTL - 1 and the header
    checksum (verified by decode_outputs, as are the transport checksums)."""
    assert o.side == side, f"left on {o.side}, expected {side}"
    raw = h.raw_of(o)
    sent = bytes(trigger)
    assert raw[:14] == sent[:14], "Ethernet header changed"
    got, want = h.ip_bytes(o.pkt), h.ip_bytes(Ether(sent))
    assert got[8] == want[8] - 1, f"TTL {want[8]} left as {got[8]}"
    assert got[:8] == want[:8] and got[9:10] == want[9:10] and got[12:] == want[12:], (
        "router mode changed the packet beyond TTL and header checksum (it must not translate):\n"
        f" sent {want.hex()}\n got  {got.hex()}")


def _v4_mix_in2out():
    return [
        (T0, "inside", h.udp_out(SUB_A, 40000, SRV1, 53, b"r-udp")),
        (T0 + 0.1, "inside", h.tcp_out(SUB_A, 40001, SRV1, 80, "S", seq=1000)),
        (T0 + 0.2, "inside", h.echo_out(SUB_A, SRV1, 0x4242, seq=5, payload=b"r-ping")),
    ]


def _v4_mix_out2in():
    return [
        (T0, "outside", h.udp_in(SRV1, 53, SUB_A, 40000, b"r-udp-in")),
        (T0 + 0.1, "outside", h.tcp_in(SRV1, 5555, SUB_A, 22, "S", seq=777)),
        (T0 + 0.2, "outside", h.eth_out() / IP(src=SRV1, dst=SUB_A, ttl=64)
         / ICMP(type=8, code=0, id=0x4343, seq=6) / Raw(b"r-ping-in")),
    ]


@pytest.mark.parametrize("direction", ["in2out", "out2in"])
def test_router_mode_forwards_untranslated(replay, direction):
    """`[nat] mode = "off"` needs no pool: UDP, TCP and ICMP echo leave on the
    other side untranslated (addresses, ports, identifiers, transport
    checksums as sent), TTL one lower, IPv4 header checksum valid. As a router
    it forwards outside-to-inside traffic with no prior outbound packet too.
    No mapping is created."""
    if direction == "in2out":
        frames, leave = _v4_mix_in2out(), "outside"
    else:
        frames, leave = _v4_mix_out2in(), "inside"
    outs, rep = replay(CFG_OFF, frames)
    assert len(outs) == 3, h.dump(outs)
    outs = sorted(outs, key=lambda o: o.ts)
    for o, (_ts, _side, f) in zip(outs, frames):
        _check_routed4(o, f, leave)
    check_counts(rep, **{"in": 3, "out": 3, f"out_{leave}": 3, "generated": 0, "dropped": 0})
    assert rep["drops"] == {}, rep["drops"]
    assert rep["mappings_created"] == 0, rep


@pytest.mark.parametrize("inside", [None, ("192.168.7.1/24", "192.168.7.10")], ids=["default-inside", "custom-inside"])
def test_router_mode_ttl_expired(replay, inside):
    """RFC 1812 section 5.3.1 / RFC 792: in router mode a datagram with TTL 1
    (or 0) is not forwarded (`ttl_expired`) and is answered with ICMP time
    exceeded 11/0 from natrix's address on the side it arrived on: `[inside]
    address` (default 100.64.0.1) inside, `[outside] address` outside. The
    error quotes the datagram as received."""
    in_addr, sub = (INSIDE_ADDR, SUB_A) if inside is None else (inside[0].split("/")[0], inside[1])
    cfg = (f'[inside]\naddress = "{inside[0]}"\n' if inside else "") + CFG_OFF_OUT
    t1 = h.udp_out(sub, 40000, SRV1, 53, b"t1", ttl=1)
    t0 = h.udp_out(sub, 40000, SRV1, 53, b"t0", ttl=0)
    t1o = h.udp_in(SRV1, 53, sub, 40000, b"t1o", ttl=1)
    t2 = h.udp_out(sub, 40000, SRV1, 53, b"t2", ttl=2)
    outs, rep = replay(cfg, [(T0, "inside", t1), (T0 + 1, "inside", t0), (T0 + 2, "outside", t1o),
                             (T0 + 3, "inside", t2)])
    _check_routed4(one(outs, "outside", h.has_payload(b"t2")), t2, "outside")
    errs = sorted(pick(outs, None, h.is_icmp_error), key=lambda o: o.ts)
    assert len(errs) == 3, h.dump(outs)
    for e, trig, side, src, dst, tup in [
        (errs[0], t1, "inside", in_addr, sub, (sub, SRV1, 40000, 53)),
        (errs[1], t0, "inside", in_addr, sub, (sub, SRV1, 40000, 53)),
        (errs[2], t1o, "outside", OUTSIDE_ADDR, SRV1, (SRV1, sub, 53, 40000)),
    ]:
        assert e.side == side, f"time exceeded left on {e.side}, expected {side}"
        t, c, emb = icmp_info(e.pkt)
        assert (t, c) == (11, 0)
        assert (e.pkt[IP].src, e.pkt[IP].dst) == (src, dst)
        assert e.pkt[Ether].src == trig[Ether].dst and e.pkt[Ether].dst == trig[Ether].src
        assert emb is not None and (emb.src, emb.dst, emb.sport, emb.dport) == tup, "quote translated or wrong"
    assert len(outs) == 4, h.dump(outs)
    assert rep["drops"] == {"ttl_expired": 3}, rep["drops"]
    assert rep["packets"]["generated"] == 3


def test_router_mode_own_address_not_forwarded(replay):
    """A datagram addressed to natrix itself (its inside address from inside,
    its outside address from outside) is not forwarded; it is counted as
    dropped (`local_destination`)."""
    frames = [
        (T0, "inside", h.udp_out(SUB_A, 40000, INSIDE_ADDR, 9999, b"to-me-in")),
        (T0 + 1, "outside", h.udp_in(SRV1, 53, OUTSIDE_ADDR, 9999, b"to-me-out")),
    ]
    outs, rep = replay(CFG_OFF_OUT, frames)
    for tag in (b"to-me-in", b"to-me-out"):
        for side in ("inside", "outside"):
            h.none_of(outs, side, h.has_payload(tag), f"forwarded datagram to natrix ({tag!r})")
    assert rep["drops"].get("local_destination") == 2, rep["drops"]
    assert rep["packets"]["out"] == rep["packets"]["generated"], rep["packets"]


def test_check_config_mode_off_without_pool(natrix, tmp_path):
    """Contract: in mode "off" `pool` is optional."""
    p = tmp_path / "off.toml"
    p.write_text(CFG_OFF_OUT)
    proc = natrix("check-config", p)
    assert proc.returncode == 0, h.proc_text(proc)


@pytest.mark.parametrize("key,line", [
    ("pool", 'pool = ["203.0.113.1/32"]'),
    ("static", 'static = [{ proto = "tcp", inside = "100.64.0.5:22", outside = "203.0.113.1:2222" }]'),
    ("port_block_size", "port_block_size = 64"),
])
def test_check_config_mode_off_refuses_translation_keys(natrix, replay_files, tmp_path, key, line):
    """Contract: `check-config` refuses keys that need translation in mode
    "off", naming them (README: exit 2); replay refuses the config too."""
    text = CFG_OFF + line + "\n"
    p = tmp_path / "off-bad.toml"
    p.write_text(text)
    proc = natrix("check-config", p)
    out = h.proc_text(proc)
    assert proc.returncode == 2, f"mode off with {key}: exit {proc.returncode}\n{out}"
    assert key in out, f"message does not name {key!r}:\n{out}"
    rproc, _d = replay_files(text, [(T0, "inside", h.udp_out(SUB_A, 40000, SRV1, 53, b"x"))])
    assert rproc.returncode != 0 and key in h.proc_text(rproc), h.proc_text(rproc)


def test_check_config_mode_off_names_every_translation_key(natrix, tmp_path):
    """Contract: refused keys are named, all of them, and PCP's lifetime is
    one (PCP creates mappings)."""
    p = tmp_path / "off-bad.toml"
    p.write_text(CFG_OFF + 'pool = ["203.0.113.1/32"]\nport_block_size = 64\n[pcp]\nmax_lifetime = "1h"\n')
    proc = natrix("check-config", p)
    out = h.proc_text(proc)
    assert proc.returncode == 2, out
    assert "nat.pool" in out and "nat.port_block_size" in out, f"both [nat] keys should be named:\n{out}"
    p.write_text(CFG_OFF + '[pcp]\nmax_lifetime = "1h"\n')
    proc = natrix("check-config", p)
    out = h.proc_text(proc)
    assert proc.returncode == 2 and "pcp.max_lifetime" in out, f"mode off with a PCP lifetime: exit {proc.returncode}\n{out}"


# ---------------------------------------------------------------------------
# 4. Determinism
# ---------------------------------------------------------------------------


def _mixed_frames():
    big = b"B" * 1400
    fr = [
        (T0, "inside", udp6_in(b"d-v6-1")),
        (T0 + 0.1, "outside", udp6_out(b"d-v6-2")),
        (T0 + 0.2, "inside", udp6_in(b"d-v6-ext", ext=[hbh(), dstopt()])),
        (T0 + 0.3, "inside", udp6_in(big, hlim=1)),
        (T0 + 0.4, "outside", udp6_out(b"d-v6-hl", hlim=1)),
        (T0 + 0.5, "inside", udp6_in(b"d-v6-msrc", hlim=1, src="ff0e::1")),
    ]
    t = T0 + 1
    for i in range(5):
        fr.append((t + i * 0.1, "inside", bytes(h.udp_out(SUB_A, 40000 + i, SRV1, 53, b"d4-%d" % i))))
    fr.append((t + 1, "inside", bytes(h.tcp_out(SUB_A, 41000, SRV1, 80, "S", seq=5))))
    fr.append((t + 1.1, "outside", bytes(h.udp_in(SRV1, 53, SUB_A, 40000, b"d4-back"))))
    fr.append((t + 1.2, "inside", bytes(h.udp_out(SUB_A, 40000, SRV1, 53, b"d4-ttl1", ttl=1))))
    fr.append((t + 1.3, "inside", bytes(h.echo_out(SUB_A, SRV1, 99, payload=b"d4-ping"))))
    return fr


@pytest.mark.parametrize("config", [CFG_OFF_OUT, CFG_NAPT44], ids=["router-mode", "napt44"])
def test_router_and_ipv6_output_deterministic(replay_files, config):
    """Contract: the same input and config give byte-identical output (and the
    same report), here with IPv6 routing, hop-limit errors, and IPv4 in
    router mode or NAPT44."""
    frames = _mixed_frames()
    outs = []
    for _ in range(2):
        proc, d = replay_files(config, frames)
        assert proc.returncode == 0, h.proc_text(proc)
        verify_output(h.check_output_capture(d / "out.pcapng"))
        outs.append(((d / "out.pcapng").read_bytes(), json.loads((d / "r.json").read_text())))
    assert outs[0][0] == outs[1][0], "output capture differs between two identical runs"
    assert outs[0][1] == outs[1][1], "report differs between two identical runs"
    assert outs[0][1]["packets"]["out"] >= 10, outs[0][1]["packets"]
