"""NPTv6 (RFC 6296) in replay, judged by scapy (CONTRACTS.md "NPTv6").

Written from RFC 6296 section 3 and the contract, not from natrix's source:
`rfc6296_map` below is this suite's own mapper (prefix replaced, the
one's-complement difference of the prefixes added to the word section 3.4
or 3.5 chooses, 0xFFFF written as 0x0000, no mapping for a subnet word
(/48 and shorter) or all four interface-identifier words of 0xFFFF).

Every output frame's IPv6 transport checksum is recomputed with scapy's
checksum() over the RFC 8200 pseudo-header (test_router.verify_output); on
top, the tests check that NPTv6 left the checksum field byte for byte as
sent (checksum neutrality: nothing was recomputed, and it still verifies).
"""

import ipaddress
import random
import struct

import pytest
from scapy.layers.inet6 import (
    ICMPv6DestUnreach,
    ICMPv6EchoReply,
    ICMPv6EchoRequest,
    ICMPv6PacketTooBig,
    ICMPv6TimeExceeded,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    PadN,
)

import natrix_harness as h
from natrix_harness import T0, TCP, UDP, Ether, Raw
from test_router import check_counts, ipv6_of, run6, show, upper_layer6

# RFC 6296 section 3.6's binding, as CONTRACTS.md gives it.
RFC_INSIDE, RFC_OUTSIDE = "fd01:203:405::/48", "2001:db8:1::/48"
RFC_HOST, RFC_EXTERNAL = "fd01:203:405:1::1234", "2001:db8:1:d550::1234"
SERVER = "2001:db8:ff::20"       # a host on the internet, outside every binding
ROUTER_OUT = "2001:db8:fe::1"    # a router on the internet sending ICMPv6 errors


def binding_toml(inside, outside):
    return f'[[nptv6]]\ninside = "{inside}"\noutside = "{outside}"\n'


def config(*bindings, mode="off"):
    nat = '[nat]\nmode = "off"\n' if mode == "off" else '[nat]\npool = ["203.0.113.1/32"]\n'
    return nat + "".join(binding_toml(i, o) for i, o in bindings)


# ---------------------------------------------------------------------------
# RFC 6296 section 3, independently
# ---------------------------------------------------------------------------

def _add(a, b):
    s = a + b
    return (s & 0xFFFF) + (s >> 16)


def _sum16(words):
    acc = 0
    for w in words:
        acc = _add(acc, w)
    return acc


def _words(addr):
    return list(struct.unpack("!8H", ipaddress.IPv6Address(addr).packed))


def rfc6296_map(addr, from_prefix, to_prefix):
    """Section 3: `addr` (in `from_prefix`) mapped into `to_prefix`; None when
    the section gives it no mapping."""
    src_net = ipaddress.IPv6Network(from_prefix)
    dst_net = ipaddress.IPv6Network(to_prefix)
    assert src_net.prefixlen == dst_net.prefixlen
    plen = src_net.prefixlen
    assert ipaddress.IPv6Address(addr) in src_net
    # Section 3.2: adjustment = sum(from prefix) - sum(to prefix), one's complement.
    adj = _add(_sum16(_words(src_net.network_address)), ~_sum16(_words(dst_net.network_address)) & 0xFFFF)
    host_mask = (1 << (128 - plen)) - 1
    value = int(dst_net.network_address) | (int(ipaddress.IPv6Address(addr)) & host_mask)
    w = list(struct.unpack("!8H", value.to_bytes(16, "big")))
    if plen <= 48:
        idx = 3                                           # section 3.4
        if w[idx] == 0xFFFF:
            return None
    else:
        idx = next((i for i in range(4, 8) if w[i] != 0xFFFF), None)   # section 3.5
        if idx is None:
            return None
    w[idx] = _add(w[idx], adj)
    if w[idx] == 0xFFFF:
        w[idx] = 0
    return str(ipaddress.IPv6Address(struct.pack("!8H", *w)))


def test_the_mapper_reproduces_the_rfc_example():
    """Section 3.6, word for word: adjustment 0xD54F, subnet 0x0001 -> 0xD550."""
    assert rfc6296_map(RFC_HOST, RFC_INSIDE, RFC_OUTSIDE) == RFC_EXTERNAL
    assert rfc6296_map(RFC_EXTERNAL, RFC_OUTSIDE, RFC_INSIDE) == RFC_HOST


# ---------------------------------------------------------------------------
# Frames and checks
# ---------------------------------------------------------------------------

def eth_in():
    return Ether(src="02:10:00:00:00:10", dst=h.NAT_IN_MAC, type=0x86DD)


def eth_out():
    return Ether(src=h.GW_MAC, dst=h.NAT_OUT_MAC, type=0x86DD)


def udp_in(src, dst=SERVER, payload=b"nptv6-out", hlim=64, ext=()):
    p = IPv6(src=src, dst=dst, hlim=hlim, fl=0x12345, tc=0x28)
    for e in ext:
        p = p / e
    return bytes(eth_in() / p / UDP(sport=40000, dport=53) / Raw(payload))


def udp_out(dst, src=SERVER, payload=b"nptv6-in", hlim=64):
    return bytes(eth_out() / IPv6(src=src, dst=dst, hlim=hlim, fl=0xABCDE) / UDP(sport=53, dport=40000) / Raw(payload))


def addrs(raw):
    ipb = ipv6_of(raw)
    return str(ipaddress.IPv6Address(ipb[8:24])), str(ipaddress.IPv6Address(ipb[24:40]))


def transport_checksum(raw):
    ipb = ipv6_of(raw)
    nh, off, _ = upper_layer6(ipb)
    at = {17: 6, 6: 16, 58: 2}[nh]
    return ipb[off + at:off + at + 2]


def check_translated(rec, sent, side, src, dst):
    """Left on `side` with addresses (src, dst), hop limit one lower, every
    other byte of the IPv6 packet as sent, the transport checksum field
    included (its validity is checked by run6)."""
    _ts, s, raw = rec
    assert s == side, f"left on {s}, expected {side}"
    assert raw[:14] == sent[:14], "Ethernet header changed"
    assert addrs(raw) == (src, dst), f"addresses {addrs(raw)}, expected {(src, dst)}"
    got, want = ipv6_of(raw), ipv6_of(sent)
    assert got[7] == want[7] - 1, f"hop limit {want[7]} left as {got[7]}"
    assert got[:7] == want[:7] and got[40:] == want[40:], (
        "NPTv6 changed more than the addresses and hop limit (a checksum it must not touch?):\n"
        f" sent {want.hex()}\n got  {got.hex()}")
    assert transport_checksum(raw) == transport_checksum(sent)


# ---------------------------------------------------------------------------
# 1. The RFC example, both ways, with TCP, UDP and ICMPv6 echo
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["off", "napt44"])
def test_rfc_example_out_and_back(replay_files, mode):
    """CONTRACTS / RFC 6296 section 3.6: with fd01:203:405::/48 <->
    2001:db8:1::/48, fd01:203:405:1::1234 leaves as 2001:db8:1:d550::1234 and
    the reply to that address comes back to fd01:203:405:1::1234. Works with
    `[nat] mode = "off"` and beside NAPT44."""
    out = udp_in(RFC_HOST)
    back = udp_out(RFC_EXTERNAL)
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE), mode=mode),
                     [(T0, "inside", out), (T0 + 1, "outside", back)])
    assert len(recs) == 2, show(recs)
    recs.sort(key=lambda r: r[0])
    check_translated(recs[0], out, "outside", RFC_EXTERNAL, SERVER)
    check_translated(recs[1], back, "inside", SERVER, RFC_HOST)
    check_counts(rep, **{"in": 2, "out": 2, "dropped": 0, "generated": 0})


def test_tcp_and_echo_translated_checksums_untouched(replay_files):
    """Section 3.1: checksum-neutral, whatever the transport: a TCP SYN and
    an ICMPv6 echo request out, their answers back, each checksum field as
    the sender wrote it and valid after translation."""
    ext = RFC_EXTERNAL
    frames = [
        (T0, "inside", bytes(eth_in() / IPv6(src=RFC_HOST, dst=SERVER) / TCP(sport=40001, dport=443, flags="S", seq=7))),
        (T0 + 1, "outside", bytes(eth_out() / IPv6(src=SERVER, dst=ext) / TCP(sport=443, dport=40001, flags="SA", seq=9, ack=8))),
        (T0 + 2, "inside", bytes(eth_in() / IPv6(src=RFC_HOST, dst=SERVER) / ICMPv6EchoRequest(id=5, seq=1, data=b"p6"))),
        (T0 + 3, "outside", bytes(eth_out() / IPv6(src=SERVER, dst=ext) / ICMPv6EchoReply(id=5, seq=1, data=b"p6"))),
    ]
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), frames)
    assert len(recs) == 4, show(recs)
    recs.sort(key=lambda r: r[0])
    for rec, (_ts, side, f) in zip(recs, frames):
        if side == "inside":
            check_translated(rec, f, "outside", ext, SERVER)
        else:
            check_translated(rec, f, "inside", SERVER, RFC_HOST)


def test_extension_headers_and_fragments_translate(replay_files):
    """Stateless: a packet with Hop-by-Hop and Destination Options headers,
    and a non-first fragment (no transport header at all), are mapped like
    any other."""
    hbh = IPv6ExtHdrHopByHop(options=[PadN(optdata=b"\x00" * 4)])
    dst = IPv6ExtHdrDestOpt(options=[PadN(optdata=b"\x00" * 12)])
    with_ext = udp_in(RFC_HOST, ext=[hbh, dst])
    frag = bytes(eth_in() / IPv6(src=RFC_HOST, dst=SERVER) / IPv6ExtHdrFragment(offset=100, m=0, id=77, nh=17) / Raw(b"z" * 24))
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "inside", with_ext), (T0 + 1, "inside", frag)])
    assert len(recs) == 2, show(recs)
    recs.sort(key=lambda r: r[0])
    check_translated(recs[0], with_ext, "outside", RFC_EXTERNAL, SERVER)
    _ts, side, raw = recs[1]
    assert side == "outside" and addrs(raw) == (RFC_EXTERNAL, SERVER)
    assert ipv6_of(raw)[40:] == ipv6_of(frag)[40:]


def test_unclaimed_ipv6_is_routed_untouched(replay_files):
    """Addresses outside every binding: routed as before (hop limit only)."""
    f_in = udp_in("fd99::5")
    f_out = udp_out("2001:db8:77::5")
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "inside", f_in), (T0 + 1, "outside", f_out)])
    assert len(recs) == 2, show(recs)
    recs.sort(key=lambda r: r[0])
    check_translated(recs[0], f_in, "outside", "fd99::5", SERVER)
    check_translated(recs[1], f_out, "inside", SERVER, "2001:db8:77::5")


# ---------------------------------------------------------------------------
# 2. Property: random prefixes and addresses
# ---------------------------------------------------------------------------

def _random_prefix(rng, plen, first):
    value = (first << 112 | rng.getrandbits(112)) & ~((1 << (128 - plen)) - 1)
    return f"{ipaddress.IPv6Address(value)}/{plen}"


def _random_host(rng, prefix):
    net = ipaddress.IPv6Network(prefix)
    host = rng.getrandbits(128 - net.prefixlen)
    if rng.random() < 0.2:      # all-ones words now and then: the 0xFFFF rules
        host |= (1 << (128 - net.prefixlen)) - 1 ^ rng.getrandbits(16)
    return str(net.network_address + host)


@pytest.mark.parametrize("seed", range(4))
def test_random_prefixes_and_addresses(replay_files, seed):
    """For random prefix lengths (/8 to /64, both word choices of sections
    3.4 and 3.5) and random hosts: each frame leaves with exactly the
    address RFC 6296 gives (this suite's mapper), its UDP checksum field
    untouched and valid, and the reply to that address comes back to the
    original host; hosts the RFC cannot map are dropped as
    `nptv6_unmappable`."""
    rng = random.Random(seed)
    plen = rng.choice([8, 16, 20, 33, 44, 48, 49, 56, 60, 63, 64])
    inside = _random_prefix(rng, plen, 0xFD00 | rng.getrandbits(8))
    outside = _random_prefix(rng, plen, 0x2000 | rng.getrandbits(8))
    # A server inside the site's outside prefix would be hairpinned (section 4.3).
    server = next(a for a in (SERVER, "3ffe:ffff::20") if ipaddress.IPv6Address(a) not in ipaddress.IPv6Network(outside))
    hosts = [_random_host(rng, inside) for _ in range(24)]
    frames, expect, t = [], [], T0
    for i, host in enumerate(hosts):
        external = rfc6296_map(host, inside, outside)
        frames.append((t, "inside", udp_in(host, server, payload=b"p%d" % i)))
        expect.append((host, external))
        t += 0.01
        if external is not None:
            frames.append((t, "outside", udp_out(external, server, payload=b"r%d" % i)))
            t += 0.01
    recs, rep = run6(replay_files, config((inside, outside)), frames)
    by_payload = {}
    for rec in recs:
        ipb = ipv6_of(rec[2])
        by_payload[ipb[48:]] = rec
    unmappable = 0
    for i, (host, external) in enumerate(expect):
        sent = next(f for _t, s, f in frames if s == "inside" and ipv6_of(f)[48:] == b"p%d" % i)
        if external is None:
            unmappable += 1
            assert b"p%d" % i not in by_payload, f"unmappable {host} was forwarded"
            continue
        check_translated(by_payload[b"p%d" % i], sent, "outside", external, server)
        back = next(f for _t, s, f in frames if s == "outside" and ipv6_of(f)[48:] == b"r%d" % i)
        check_translated(by_payload[b"r%d" % i], back, "inside", server, host)
    assert rep["drops"] == ({"nptv6_unmappable": unmappable} if unmappable else {}), rep["drops"]


# ---------------------------------------------------------------------------
# 3. The 0xFFFF cases
# ---------------------------------------------------------------------------

def test_adjusted_word_of_ffff_is_written_as_zero(replay_files):
    """Section 3.4: subnet 0x2AB0 + 0xD54F = 0xFFFF, written 0x0000: the host
    leaves as 2001:db8:1::1 and the reply to that address comes back."""
    host = "fd01:203:405:2ab0::1"
    assert rfc6296_map(host, RFC_INSIDE, RFC_OUTSIDE) == "2001:db8:1::1"
    out, back = udp_in(host), udp_out("2001:db8:1::1")
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "inside", out), (T0 + 1, "outside", back)])
    recs.sort(key=lambda r: r[0])
    assert len(recs) == 2, show(recs)
    check_translated(recs[0], out, "outside", "2001:db8:1::1", SERVER)
    check_translated(recs[1], back, "inside", SERVER, host)


@pytest.mark.parametrize("inside,outside,host_in,host_out", [
    (RFC_INSIDE, RFC_OUTSIDE, "fd01:203:405:ffff::1", "2001:db8:1:ffff::1"),
    ("fd01:203:405:600::/56", "2001:db8:1:100::/56", "fd01:203:405:6aa:ffff:ffff:ffff:ffff", "2001:db8:1:1aa:ffff:ffff:ffff:ffff"),
], ids=["subnet-ffff-/48", "iid-all-ffff-/56"])
def test_unmappable_dropped_and_counted_both_ways(replay_files, inside, outside, host_in, host_out):
    """CONTRACTS: a subnet word of 0xFFFF (/48 and shorter), or four
    interface-identifier words of 0xFFFF (longer prefixes), has no mapping:
    dropped and counted as `nptv6_unmappable`, in both directions."""
    recs, rep = run6(replay_files, config((inside, outside)),
                     [(T0, "inside", udp_in(host_in)), (T0 + 1, "outside", udp_out(host_out))])
    assert recs == [], show(recs)
    assert rep["drops"] == {"nptv6_unmappable": 2}, rep["drops"]


def test_hairpinning_between_two_hosts_of_the_site(replay_files):
    """Section 4.3: NPTv6 translators MUST support hairpinning (RFC 4787's):
    a packet from inside to an address of the site's outside prefix has its
    source mapped out and its destination mapped in, and goes back inside;
    the reply the same way round. Addresses by this suite's section 3
    mapper; every other byte, the UDP checksum field included, untouched."""
    host_b = "fd01:203:405:2::5678"
    ext_b = rfc6296_map(host_b, RFC_INSIDE, RFC_OUTSIDE)
    to_b = udp_in(RFC_HOST, ext_b, payload=b"hairpin-ab")
    to_a = udp_in(host_b, RFC_EXTERNAL, payload=b"hairpin-ba")
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "inside", to_b), (T0 + 1, "inside", to_a)])
    recs.sort(key=lambda r: r[0])
    assert len(recs) == 2, show(recs)
    check_translated(recs[0], to_b, "inside", RFC_EXTERNAL, host_b)
    check_translated(recs[1], to_a, "inside", ext_b, RFC_HOST)
    check_counts(rep, **{"in": 2, "out": 2, "dropped": 0, "generated": 0})


def test_site_local_destinations_never_leave_outside(replay_files):
    """A packet from inside to the site's own (inside) prefix is not the
    translator's to send out: it goes back inside with its addresses as
    sent, never out with a mapped source and a site-local destination."""
    to_site = udp_in(RFC_HOST, "fd01:203:405:9::1", payload=b"site-local")
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "inside", to_site)])
    assert len(recs) == 1, show(recs)
    _ts, side, raw = recs[0]
    assert side == "inside" and addrs(raw) == (RFC_HOST, "fd01:203:405:9::1"), show(recs)


def test_longer_prefix_skips_ffff_words(replay_files):
    """Section 3.5 (/49 to /64): the adjustment goes into the first of the
    interface identifier's words that is not 0xFFFF."""
    inside, outside = "fd01:203:405:600::/56", "2001:db8:1:100::/56"
    host = "fd01:203:405:6aa:ffff:ffff:1:2"
    external = rfc6296_map(host, inside, outside)
    assert external.startswith("2001:db8:1:1aa:ffff:ffff:")
    recs, rep = run6(replay_files, config((inside, outside)), [(T0, "inside", udp_in(host)), (T0 + 1, "outside", udp_out(external))])
    recs.sort(key=lambda r: r[0])
    assert len(recs) == 2, show(recs)
    assert addrs(recs[0][2]) == (external, SERVER)
    assert addrs(recs[1][2]) == (SERVER, host)


# ---------------------------------------------------------------------------
# 4. ICMPv6 errors
# ---------------------------------------------------------------------------

def quoted_addrs(raw):
    ipb = ipv6_of(raw)
    nh, off, _ = upper_layer6(ipb)
    assert nh == 58
    q = ipb[off + 8:]
    return str(ipaddress.IPv6Address(q[8:24])), str(ipaddress.IPv6Address(q[24:40]))


@pytest.mark.parametrize("error", [
    lambda: ICMPv6DestUnreach(code=4),
    lambda: ICMPv6PacketTooBig(mtu=1280),
    lambda: ICMPv6TimeExceeded(code=0),
], ids=["dest-unreach", "packet-too-big", "time-exceeded"])
def test_icmpv6_error_from_outside_maps_the_quoted_source(replay_files, error):
    """An error from the internet about a packet the host sent (quoting it
    as it left natrix, from the external address): the outer destination is
    mapped to the host and the quoted packet the other way, its source back
    to the host's own address; the ICMPv6 checksum field is unchanged and
    still verifies."""
    quoted = bytes(IPv6(src=RFC_EXTERNAL, dst=SERVER, hlim=1) / UDP(sport=40000, dport=53) / Raw(b"orig"))
    err = bytes(eth_out() / IPv6(src=ROUTER_OUT, dst=RFC_EXTERNAL) / error() / Raw(quoted))
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "outside", err)])
    assert len(recs) == 1, show(recs)
    _ts, side, raw = recs[0]
    assert side == "inside"
    assert addrs(raw) == (ROUTER_OUT, RFC_HOST)
    assert quoted_addrs(raw) == (RFC_HOST, SERVER)
    assert transport_checksum(raw) == transport_checksum(err)


def test_icmpv6_error_from_inside_maps_the_quoted_destination(replay_files):
    """The host's own error (port unreachable) about a packet the server
    sent it: the outer source leaves as the external address and the quoted
    destination is mapped too, so the server recognises its packet."""
    quoted = bytes(IPv6(src=SERVER, dst=RFC_HOST, hlim=60) / UDP(sport=53, dport=40000) / Raw(b"to-host"))
    err = bytes(eth_in() / IPv6(src=RFC_HOST, dst=SERVER) / ICMPv6DestUnreach(code=4) / Raw(quoted))
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "inside", err)])
    assert len(recs) == 1, show(recs)
    _ts, side, raw = recs[0]
    assert side == "outside"
    assert addrs(raw) == (RFC_EXTERNAL, SERVER)
    assert quoted_addrs(raw) == (SERVER, RFC_EXTERNAL)
    assert transport_checksum(raw) == transport_checksum(err)


def test_hop_limit_expiry_is_answered_before_translation(replay_files):
    """A hop-limit-1 packet from the host dies at natrix: the time exceeded
    goes back inside quoting the packet as the host sent it (its own inside
    address), and nothing leaves outside."""
    f = udp_in(RFC_HOST, hlim=1)
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "inside", f)])
    assert len(recs) == 1 and recs[0][1] == "inside", show(recs)
    assert quoted_addrs(recs[0][2])[0] == RFC_HOST
    assert rep["drops"] == {"ttl_expired": 1}


# ---------------------------------------------------------------------------
# 5. Several bindings
# ---------------------------------------------------------------------------

def test_several_bindings_at_once(replay_files):
    """Three bindings of different lengths in one configuration: each host
    is mapped by the binding that holds it, both ways."""
    bindings = [(RFC_INSIDE, RFC_OUTSIDE), ("fd02:0:0:7::/64", "2001:db8:2:7::/64"), ("fd03::/32", "2001:db9::/32")]
    hosts = ["fd01:203:405:1::1234", "fd02::7:a:b:c:d", "fd03:0:5:6::7"]
    frames, expected = [], []
    for i, ((inside, outside), host) in enumerate(zip(bindings, hosts)):
        external = rfc6296_map(host, inside, outside)
        frames += [(T0 + i, "inside", udp_in(host, payload=b"o%d" % i)), (T0 + i + 0.5, "outside", udp_out(external, payload=b"i%d" % i))]
        expected += [("outside", external, SERVER), ("inside", SERVER, host)]
    recs, rep = run6(replay_files, config(*bindings), frames)
    recs.sort(key=lambda r: r[0])
    assert len(recs) == 6, show(recs)
    for rec, (side, src, dst), (_t, _s, sent) in zip(recs, expected, frames):
        check_translated(rec, sent, side, src, dst)
    assert rep["drops"] == {}


# ---------------------------------------------------------------------------
# 6. Configuration and bad input
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bindings,key", [
    ([("fd01:203:405::/48", "2001:db8:1::/56")], "nptv6[0].outside"),
    ([("fd01:203:405:1:1::/80", "2001:db8:1:1:1::/80")], "nptv6[0].inside"),
    ([(RFC_INSIDE, RFC_OUTSIDE), ("fd01:203::/32", "2001:db9::/32")], "nptv6[1].inside"),
    ([(RFC_INSIDE, RFC_OUTSIDE), ("fd02::/48", "2001:db8:1:5::/64")], "nptv6[1].outside"),
], ids=["unequal-lengths", "longer-than-64", "overlapping-inside", "overlapping-outside"])
def test_check_config_refuses_bad_bindings(natrix, tmp_path, bindings, key):
    """CONTRACTS: prefixes longer than /64 are refused; so are prefixes of
    unequal length and bindings that overlap; the message names the key."""
    p = tmp_path / "bad.toml"
    p.write_text(config(*bindings))
    proc = natrix("check-config", p)
    assert proc.returncode != 0, h.proc_text(proc)
    assert key in h.proc_text(proc), h.proc_text(proc)


def test_check_config_accepts_nptv6_with_mode_off(natrix, tmp_path):
    p = tmp_path / "ok.toml"
    p.write_text(config((RFC_INSIDE, RFC_OUTSIDE)))
    proc = natrix("check-config", p)
    assert proc.returncode == 0, h.proc_text(proc)


def _hdr(src, dst, nh=17, plen=8, hlim=64):
    return bytes(eth_in()) + struct.pack("!IHBB", 6 << 28, plen, nh, hlim) + \
        ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(dst).packed


BAD_INPUT = {
    # Shorter than the 40-byte IPv6 header.
    "short-header": lambda: _hdr(RFC_HOST, SERVER)[:14 + 30],
    # Payload length past the end of the frame.
    "lying-payload-length": lambda: _hdr(RFC_HOST, SERVER, plen=400) + b"\x00" * 8,
    # Destination Options headers each pointing at the next, past any sane count.
    "endless-extension-headers": lambda: _hdr(RFC_HOST, SERVER, nh=60, plen=8 * 40)
    + b"".join(bytes([60, 0, 1, 4, 0, 0, 0, 0]) for _ in range(40)),
    # An extension header running past the payload.
    "extension-header-past-payload": lambda: _hdr(RFC_HOST, SERVER, nh=60, plen=8) + bytes([17, 5, 1, 4, 0, 0, 0, 0]),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_ipv6_input_is_dropped_and_counted(replay_files, case):
    """Malformed IPv6 from a host in a binding is never translated or
    forwarded: dropped and counted (under the parse's reasons)."""
    f = BAD_INPUT[case]()
    recs, rep = run6(replay_files, config((RFC_INSIDE, RFC_OUTSIDE)), [(T0, "inside", f)])
    assert recs == [], show(recs)
    check_counts(rep, **{"in": 1, "out": 0, "dropped": 1})
    assert set(rep["drops"]) <= {"ipv6_truncated", "ipv6_bad_header"}, rep["drops"]
