"""IP fragments (RFC 4787 REQ-14, RFC 5382 / RFC 7857 sec 3 contract: no reassembly)."""

import socket
import struct

from scapy.all import defragment, fragment
from scapy.utils import checksum

import natrix_harness as h
from natrix_harness import (
    IP, TCP, Raw, POOL1, SRV1, SRV2, SUB_A, SUB_B, T0, UDP, eth_in, eth_out, has_payload, none_of, one, pick, udp_out,
)

PAYLOAD = bytes((i * 7) & 0xFF for i in range(2400))  # UDP length 2408 -> 808 + 808 + 792


def _frags(src, dst, sport, dport, eth, ipid):
    d = IP(src=src, dst=dst, ttl=64, id=ipid) / UDP(sport=sport, dport=dport) / PAYLOAD
    fr = fragment(d, fragsize=808)
    assert len(fr) == 3
    return [eth / f for f in fr]


def _out_frags(outs, side, ipid, src):
    """Output frames on ``side`` that are fragments of datagram ``ipid`` from ``src``
    (the IP id may legitimately be rewritten, so match on source + fragment flag)."""
    return [o for o in outs if o.side == side and IP in o.pkt and o.pkt[IP].src == src
            and (o.pkt[IP].flags.MF or o.pkt[IP].frag)]


def _reassemble_and_check(frs, sport, dport, src, dst):
    """Reassemble output fragments (own code and scapy's defragment) and verify the
    datagram: addresses, ports, payload and UDP checksum over the whole datagram."""
    ipbs = [h.ip_bytes(o.pkt) for o in frs]
    assert len({b[4:6] for b in ipbs}) == 1, "fragments of one datagram got different IP ids"
    pieces = sorted(((struct.unpack("!H", b[6:8])[0] & 0x1FFF) * 8, b[(b[0] & 0xF) * 4:]) for b in ipbs)
    seg = b""
    for off, data in pieces:
        assert off == len(seg), f"gap/overlap in output fragments at {off}"
        seg += data
    src_b, dst_b = socket.inet_aton(src), socket.inet_aton(dst)
    assert len(seg) == 8 + len(PAYLOAD)
    assert struct.unpack("!HH", seg[:4]) == (sport, dport)
    assert seg[8:] == PAYLOAD
    assert h.l4_checksum_ok(src_b, dst_b, 17, seg), "UDP checksum of the reassembled datagram is wrong"
    # scapy's reassembly agrees
    in_order = sorted(ipbs, key=lambda b: struct.unpack("!H", b[6:8])[0] & 0x1FFF)  # scapy needs offset order
    whole = [p for p in defragment([IP(b) for b in in_order]) if IP in p and not p[IP].flags.MF and p[IP].frag == 0]
    assert len(whole) == 1, "scapy could not reassemble the output fragments"
    w = whole[0]
    assert (w[IP].src, w[IP].dst, w[UDP].sport, w[UDP].dport) == (src, dst, sport, dport)
    wb = bytes(w[IP])
    assert h.l4_checksum_ok(src_b, dst_b, 17, wb[(wb[0] & 0xF) * 4:])


def _occupied_scenario(replay):
    s = h.Scenario(replay, h.make_config())
    s.add(T0 - 1, "inside", udp_out(SUB_B, 40000, SRV2, 9, b"occupy"))  # A's port 40000 gets remapped
    return s


def test_fragments_in_order(replay):
    """RFC 4787 REQ-14: a NAT MUST support receiving in-order fragments. All
    three fragments are translated (address in all, ports in the first); the
    reassembled output datagram is intact with a valid UDP checksum. The same
    holds for a fragmented reply in the other direction."""
    s = _occupied_scenario(replay)
    for i, f in enumerate(_frags(SUB_A, SRV1, 40000, 9000, eth_in(SUB_A), 0x4242)):
        s.add(T0 + i * 0.01, "inside", f)
    outs, _ = s.run()
    frs = _out_frags(outs, "outside", 0x4242, POOL1)
    assert len(frs) == 3, h.dump(outs)
    assert [o.pkt[IP].frag for o in frs] == [0, 101, 202], "in-order fragments re-ordered"
    for o in frs:
        assert (o.pkt[IP].src, o.pkt[IP].dst, o.pkt[IP].ttl) == (POOL1, SRV1, 63)
    ext_port = struct.unpack("!H", h.ip_bytes(frs[0].pkt)[20:22])[0]
    assert ext_port != 40000
    _reassemble_and_check(frs, ext_port, 9000, POOL1, SRV1)

    for i, f in enumerate(_frags(SRV1, POOL1, 9000, ext_port, eth_out(), 0x5151)):
        s.add(T0 + 1 + i * 0.01, "outside", f)
    outs, _ = s.run()
    frs_in = [o for o in outs if o.side == "inside" and IP in o.pkt and o.pkt[IP].src == SRV1
              and (o.pkt[IP].flags.MF or o.pkt[IP].frag)]
    assert len(frs_in) == 3, h.dump(outs)
    for o in frs_in:
        assert o.pkt[IP].dst == SUB_A
    _reassemble_and_check(frs_in, 9000, 40000, SRV1, SUB_A)


def test_fragments_out_of_order(replay):
    """RFC 4787 REQ-14: a NAT MUST support receiving out-of-order fragments
    (contract: non-first fragments arriving before the first are held, then sent
    after it). Last, first, middle: all three leave translated, the held last
    fragment after the first in the output file (its timestamp may be its own
    arrival time or the release time: the contract allows either); the
    reassembled datagram is valid."""
    s = _occupied_scenario(replay)
    f0, f1, f2 = _frags(SUB_A, SRV1, 40000, 9000, eth_in(SUB_A), 0x4343)
    s.add(T0, "inside", f2)
    s.add(T0 + 0.1, "inside", f0)
    s.add(T0 + 0.2, "inside", f1)
    outs, rep = s.run()
    frs = _out_frags(outs, "outside", 0x4343, POOL1)
    assert len(frs) == 3, h.dump(outs)
    offs = [o.pkt[IP].frag for o in frs]
    assert sorted(offs) == [0, 101, 202]
    assert offs.index(0) < offs.index(202), "held fragment sent before the first fragment"
    for o in frs:
        assert (o.pkt[IP].src, o.pkt[IP].dst, o.pkt[IP].ttl) == (POOL1, SRV1, 63)
    ext_port = struct.unpack("!H", h.ip_bytes(pick(frs, None, lambda p: p[IP].frag == 0)[0].pkt)[20:22])[0]
    _reassemble_and_check(frs, ext_port, 9000, POOL1, SRV1)
    assert "fragment_timeout" not in rep["drops"]


def test_lone_non_first_fragment_times_out(replay):
    """Contract [timeouts] fragment (5 s): a non-first fragment whose first
    fragment never arrives is held, then dropped (fragment_timeout) - it is never
    forwarded (no mapping can be known for it)."""
    s = h.Scenario(replay, h.make_config())
    _f0, f1, _f2 = _frags(SUB_A, SRV1, 40000, 9000, eth_in(SUB_A), 0x4444)
    s.add(T0, "inside", f1)
    s.add(T0 + 10, "inside", udp_out(SUB_B, 40100, SRV2, 53, b"time-passes"))
    outs, rep = s.run()
    none_of(outs, None, lambda p: IP in p and p[IP].id == 0x4444, "fragment")
    one(outs, "outside", has_payload(b"time-passes"))
    assert rep["drops"].get("fragment_timeout", 0) == 1, rep["drops"]


def test_tiny_first_fragment_dropped(replay):
    """RFC 1858 / RFC 3128 (tiny fragment attack) and contract reason
    fragment_too_small: a first fragment carrying only 8 bytes of the TCP header
    (no flags) cannot be translated safely and is dropped; nothing of the
    datagram is forwarded."""
    s = h.Scenario(replay, h.make_config())
    d = IP(src=SUB_A, dst=SRV1, ttl=64, id=0x4545) / TCP(sport=40000, dport=80, flags="S", seq=1) / (b"z" * 40)
    raw = bytes(d)
    first = bytearray(raw[:28])
    struct.pack_into("!H", first, 2, 28)
    struct.pack_into("!H", first, 6, 0x2000)  # MF, offset 0
    struct.pack_into("!H", first, 10, 0)
    struct.pack_into("!H", first, 10, checksum(bytes(first[:20])))
    rest = bytearray(raw[:20]) + raw[28:]
    struct.pack_into("!H", rest, 2, len(rest))
    struct.pack_into("!H", rest, 6, 1)  # offset 8 bytes, last fragment
    struct.pack_into("!H", rest, 10, 0)
    struct.pack_into("!H", rest, 10, checksum(bytes(rest[:20])))
    s.add(T0, "inside", h.raw_in(SUB_A, first))
    s.add(T0 + 0.1, "inside", h.raw_in(SUB_A, rest))
    s.add(T0 + 10, "inside", udp_out(SUB_B, 40100, SRV2, 53, b"time-passes"))
    outs, rep = s.run()
    none_of(outs, None, lambda p: IP in p and p[IP].src in (SUB_A, POOL1) and p[IP].dst == SRV1, "tiny fragment")
    one(outs, "outside", has_payload(b"time-passes"))
    assert rep["drops"].get("fragment_too_small", 0) >= 1, rep["drops"]


def test_fragment_buffer_bound(replay):
    """Contract [fragments] max_held: out-of-order (non-first) fragments are
    held only up to the bound; past it one is dropped and counted
    (fragment_buffer_full). With max_held = 2, three datagrams whose last
    fragment comes first: the oldest held fragment makes room for the third
    (README: a full buffer drops its oldest), so the first datagram is
    incomplete on the output and the other two complete."""
    s = h.Scenario(replay, h.make_config(fragments={"max_held": 2}))
    sets = [_frags(SUB_A, SRV1, 40000 + 2 * k, 9000, eth_in(SUB_A), 0x6000 + k) for k in range(3)]
    t = T0
    for k in range(3):
        s.add(t, "inside", sets[k][2]); t += 0.01
    for k in range(3):
        s.add(t, "inside", sets[k][0]); t += 0.01
        s.add(t, "inside", sets[k][1]); t += 0.01
    outs, rep = s.run()
    assert rep["drops"] == {"fragment_buffer_full": 1}, rep["drops"]
    frs = _out_frags(outs, "outside", None, POOL1)
    assert len(frs) == 8, f"expected 9 - 1 fragments on the outside\n{h.dump(outs)}"
    by_id = {}
    for o in frs:
        by_id.setdefault(h.ip_bytes(o.pkt)[4:6], []).append(o.pkt[IP].frag)
    assert sorted(sorted(v) for v in by_id.values()) == [[0, 101], [0, 101, 202], [0, 101, 202]], by_id
    assert sorted(by_id[struct.pack("!H", 0x6000)]) == [0, 101], "the oldest held fragment made room"


def test_a_fragment_pushed_out_by_the_last_frame_of_a_capture_is_counted(replay):
    """Replay contract: every frame read is forwarded or counted as dropped.
    With max_held = 2, a capture whose last frame is a third lone later
    fragment: it pushes out the oldest (fragment_buffer_full), and the two
    still held at the end time out (fragment_timeout)."""
    s = h.Scenario(replay, h.make_config(fragments={"max_held": 2}))
    for k in range(3):
        s.add(T0 + 0.01 * k, "inside", _frags(SUB_A, SRV1, 40000 + 2 * k, 9000, eth_in(SUB_A), 0x6100 + k)[2])
    outs, rep = s.run()
    assert rep["drops"] == {"fragment_buffer_full": 1, "fragment_timeout": 2}, rep["drops"]
    assert rep["packets"]["dropped"] == 3, rep["packets"]


def test_junk_fragments_from_outside_cannot_crowd_out_real_ones(replay):
    """Contract [fragments]: the buffer for out-of-order fragments is bounded,
    and anyone outside can fill it with fragments whose first never comes.
    With max_held = 8, a subscriber's own out-of-order fragment held before
    a flood of 200 junk fragments from outside, and a server's reply whose
    last fragment comes amid the flood two junk fragments before its first,
    both still reach their destination complete; the junk is dropped and
    counted (fragment_buffer_full while it crowds, fragment_timeout at the
    end)."""
    s = h.Scenario(replay, h.make_config(fragments={"max_held": 8}))
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 9000, b"open"))
    up = _frags(SUB_A, SRV1, 40002, 9000, eth_in(SUB_A), 0x7100)
    down = _frags(SRV1, POOL1, 9000, 40000, eth_out(), 0x7200)
    t = T0 + 1
    s.add(t, "inside", up[2])
    for k in range(200):
        t += 0.001
        s.add(t, "outside", eth_out() / IP(src=SRV2, dst=POOL1, id=0x8000 + k, frag=50, proto=17) / (b"j" * 64))
        if k == 150:
            s.add(t + 0.0001, "outside", down[2])
        if k == 152:
            s.add(t + 0.0001, "outside", down[0])
            s.add(t + 0.0002, "outside", down[1])
    s.add(t + 0.01, "inside", up[0])
    s.add(t + 0.02, "inside", up[1])
    outs, rep = s.run()
    ins = [o for o in outs if o.side == "inside" and IP in o.pkt and o.pkt[IP].src == SRV1]
    assert sorted(o.pkt[IP].frag for o in ins) == [0, 101, 202], f"reply incomplete: {rep['drops']}"
    _reassemble_and_check(ins, 9000, 40000, SRV1, SUB_A)
    ups = _out_frags(outs, "outside", None, POOL1)
    assert sorted(o.pkt[IP].frag for o in ups) == [0, 101, 202], f"upload incomplete: {rep['drops']}"
    assert rep["drops"].get("fragment_buffer_full", 0) + rep["drops"].get("fragment_timeout", 0) == 200, rep["drops"]
    assert rep["drops"].get("fragment_buffer_full", 0) >= 200 - 8, rep["drops"]


def test_inbound_fragments_out_of_order(replay):
    """RFC 4787 REQ-14 inbound: a fragmented reply whose fragments arrive
    middle, last, first is delivered to the subscriber complete (held
    fragments released after the first), with a valid UDP checksum over the
    reassembled datagram."""
    s = h.Scenario(replay, h.make_config())
    s.add(T0, "inside", udp_out(SUB_A, 40000, SRV1, 9000, b"open"))
    f0, f1, f2 = _frags(SRV1, POOL1, 9000, 40000, eth_out(), 0x5252)
    s.add(T0 + 1, "outside", f1)
    s.add(T0 + 1.1, "outside", f2)
    s.add(T0 + 1.2, "outside", f0)
    outs, rep = s.run()
    assert one(outs, "outside", has_payload(b"open")).pkt[UDP].sport == 40000
    frs = [o for o in outs if o.side == "inside" and IP in o.pkt and o.pkt[IP].src == SRV1
           and (o.pkt[IP].flags.MF or o.pkt[IP].frag)]
    assert len(frs) == 3, f"{rep['drops']}\n{h.dump(outs)}"
    assert frs[0].pkt[IP].frag == 0, "held fragments sent before the first fragment"
    for o in frs:
        assert (o.pkt[IP].dst, o.pkt[IP].ttl) == (SUB_A, 63)
    _reassemble_and_check(frs, 9000, 40000, SRV1, SUB_A)
