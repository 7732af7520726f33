"""Malformed and non-translatable input: dropped, counted, never a crash
(RFC 1812 sec 5.2.2 / 5.3.1, contract drop reasons)."""

import random
import struct

from scapy.layers.inet6 import IPv6
from scapy.utils import checksum

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, INSIDE_ADDR, POOL1, SRV1, SUB_A, T0, UDP, Ether, Raw, has_payload, icmp_info, one, pick, raw_in,
    raw_out, udp_out,
)


def _good_ip(payload=b"data", ttl=64, sport=40000):
    return bytearray(bytes(IP(src=SUB_A, dst=SRV1, ttl=ttl, id=7) / UDP(sport=sport, dport=53) / payload))


def _fix_ck(b: bytearray, ihl_bytes=20):
    struct.pack_into("!H", b, 10, 0)
    struct.pack_into("!H", b, 10, checksum(bytes(b[:ihl_bytes])))
    return b


def test_malformed_frames_dropped_and_counted(replay):
    """RFC 1812 sec 5.2.2: a router MUST verify the IP header (version, header
    length, total length, checksum) and silently discard invalid datagrams;
    sec 5.3.1: a datagram whose TTL would reach 0 is discarded and answered with
    ICMP Time Exceeded (11/0). Each case is counted under the contract's drop
    reason and processing continues with the next frame."""
    frames = []
    t = [T0]

    def add(side, frame):
        frames.append((t[0], side, frame))
        t[0] += 0.01

    add("inside", bytes(Ether(src=h.mac_for(SUB_A), dst=h.NAT_IN_MAC))[:10])            # eth_truncated
    # not_ipv4: neither IPv4 nor IPv6 (LLDP's ethertype). An ARP request for
    # natrix's own address is avoided on purpose: answering ARP is allowed, and
    # IPv6 is routed (CONTRACTS.md, "Wave 2: shared rules").
    add("inside", Ether(src=h.mac_for(SUB_A), dst=h.NAT_IN_MAC, type=0x88CC) / Raw(b"\x02\x07\x04" + b"\x00" * 40))
    add("inside", raw_in(SUB_A, _good_ip()[:12]))                                        # ipv4_truncated
    b = _good_ip(); b[0] = 0x65; add("inside", raw_in(SUB_A, _fix_ck(b)))                # ipv4_bad_version
    b = _good_ip(); b[0] = 0x44; add("inside", raw_in(SUB_A, _fix_ck(b)))                # ipv4_bad_header_length
    b = _good_ip(); struct.pack_into("!H", b, 2, 1000); add("inside", raw_in(SUB_A, _fix_ck(b)))  # ipv4_truncated (frame < total length)
    b = _good_ip(); struct.pack_into("!H", b, 2, 12); add("inside", raw_in(SUB_A, _fix_ck(b)))    # ipv4_bad_total_length (total < header)
    b = _good_ip(); struct.pack_into("!H", b, 10, struct.unpack("!H", b[10:12])[0] ^ 0x00FF)
    add("inside", raw_in(SUB_A, b))                                                      # ipv4_bad_checksum
    ttl1 = udp_out(SUB_A, 40001, SRV1, 53, b"ttl-one", ttl=1)
    add("inside", ttl1)                                                                  # ttl_expired
    b = bytearray(bytes(IP(src=SUB_A, dst=SRV1, ttl=64, proto=17, len=24) / Raw(b"\x9c\x40\x00\x35")))
    add("inside", raw_in(SUB_A, b))                                                      # l4_truncated (udp)
    b = bytearray(bytes(IP(src=SUB_A, dst=SRV1, ttl=64, proto=6, len=30) / Raw(b"\x9c\x40\x00\x50" + b"\x00" * 6)))
    add("inside", raw_in(SUB_A, b))                                                      # l4_truncated (tcp)
    add("inside", raw_in(SUB_A, bytes(IP(src=SUB_A, dst=SRV1, ttl=64, proto=47) / Raw(b"\x00\x00\x08\x00"))))  # gre
    add("outside", raw_out(bytes(IP(src=SRV1, dst="203.0.113.200", ttl=64) / UDP(sport=53, dport=40000) / b"x")))  # not_for_pool
    add("inside", udp_out(SUB_A, 40002, SRV1, 53, b"still-alive"))

    outs, rep = replay(h.make_config(), frames)
    expected = {
        "eth_truncated": 1, "not_ipv4": 1, "ipv4_truncated": 2, "ipv4_bad_version": 1,
        "ipv4_bad_header_length": 1, "ipv4_bad_total_length": 1, "ipv4_bad_checksum": 1,
        "ttl_expired": 1, "l4_truncated": 2, "unsupported_protocol": 1, "not_for_pool": 1,
    }
    assert rep["drops"] == expected, f"drops {rep['drops']} != {expected}"
    assert rep["packets"]["in"] == len(frames)
    assert rep["packets"]["dropped"] == sum(expected.values())

    ok = one(outs, "outside", has_payload(b"still-alive")).pkt
    assert ok[IP].src == POOL1
    errs = pick(outs, None, h.is_icmp)
    assert len(errs) == 1, h.dump(outs)
    e = errs[0]
    t_, c, emb = icmp_info(e.pkt)
    assert (t_, c) == (11, 0), "TTL 1 must be answered with ICMP Time Exceeded in transit"
    assert e.side == "inside"
    assert e.pkt[IP].dst == SUB_A
    assert e.pkt[IP].src == INSIDE_ADDR, "RFC 1812 4.3.2.4: source must be an address of the inside interface"
    assert e.pkt[Ether].src == ttl1[Ether].dst and e.pkt[Ether].dst == ttl1[Ether].src
    assert (emb.src, emb.dst, emb.sport, emb.dport) == (SUB_A, SRV1, 40001, 53), "embedded packet must be the original"
    assert len(outs) == 2, h.dump(outs)
    assert rep["packets"]["generated"] == 1


def test_random_garbage_does_not_crash(replay):
    """Robustness: 300 random frames (random bytes behind an IPv4 ethertype, some
    with a plausible IPv4 header) are all handled; natrix exits 0 and whatever it
    emits is well-formed IPv4 with valid checksums."""
    rng = random.Random(4787)
    frames = []
    for i in range(300):
        n = rng.randrange(0, 120)
        body = bytearray(rng.getrandbits(8) for _ in range(n))
        if n >= 20 and rng.random() < 0.5:
            body[0] = 0x45
            struct.pack_into("!H", body, 2, rng.choice([n, n - 1, n + 1, 20, 28]) & 0xFFFF)
            body[9] = rng.choice([1, 6, 17, 17, 6])
            body[12:16] = bytes([100, 64, 0, rng.randrange(2, 255)])
            body[16:20] = bytes([198, 51, 100, rng.randrange(2, 255)]) if rng.random() < 0.5 else bytes([203, 0, 113, 1])
            _fix_ck(body)
        side = rng.choice(["inside", "outside"])
        eth = Ether(src=h.mac_for(SUB_A), dst=h.NAT_IN_MAC, type=0x0800) if side == "inside" else \
            Ether(src=h.GW_MAC, dst=h.NAT_OUT_MAC, type=0x0800)
        frames.append((T0 + i * 0.001, side, bytes(eth) + bytes(body)))
    frames.append((T0 + 1, "inside", udp_out(SUB_A, 40002, SRV1, 53, b"still-alive")))
    outs, rep = replay(h.make_config(), frames)
    one(outs, "outside", has_payload(b"still-alive"))
    assert rep["packets"]["in"] == len(frames)
