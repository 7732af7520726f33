#!/usr/bin/env python3
"""Writes a seed corpus for the engine_process fuzz target.

Each seed is a short conversation in the target's record format
([flags][len_hi][len_lo][frame]; flags bit 0 = outside, bit 1 = repair
checksums, bits 2-7 = seconds to advance): UDP, TCP and ICMP flows out and
back, an ICMP error, fragments, hairpin and VLAN frames, and IPv6 in and
out of the target's NPTv6 bindings (ICMPv6 errors, the RFC 6296 0xFFFF
cases, extension headers, a fragment). Frames are built
with scapy so the seeds start from well-formed traffic.

usage: tools/fuzz_seeds.py fuzz/corpus/engine_process
"""

import struct
import sys
from pathlib import Path

from scapy.all import ICMP, IP, TCP, UDP, Dot1Q, Ether, Raw, fragment
from scapy.layers.inet6 import (ICMPv6DestUnreach, ICMPv6EchoRequest, ICMPv6TimeExceeded, IPv6, IPv6ExtHdrDestOpt,
                                IPv6ExtHdrFragment, IPv6ExtHdrHopByHop)

SUB, SRV, POOL = "100.64.0.10", "198.51.100.20", "203.0.113.1"
IN, OUT = 0, 1


def rec(frame, side=IN, advance=0, repair=False):
    flags = side | (2 if repair else 0) | (advance << 2)
    b = bytes(frame)
    return struct.pack("!BH", flags, len(b)) + b


def eth(pkt):
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / pkt


def seeds():
    yield [rec(eth(IP(src=SUB, dst=SRV) / UDP(sport=5000, dport=53) / Raw(b"q"))),
           rec(eth(IP(src=SRV, dst=POOL) / UDP(sport=53, dport=5000) / Raw(b"a")), OUT)]
    yield [rec(eth(IP(src=SUB, dst=SRV) / TCP(sport=40000, dport=80, flags="S"))),
           rec(eth(IP(src=SRV, dst=POOL) / TCP(sport=80, dport=40000, flags="SA")), OUT),
           rec(eth(IP(src=SUB, dst=SRV) / TCP(sport=40000, dport=80, flags="A"))),
           rec(eth(IP(src=SUB, dst=SRV) / TCP(sport=40000, dport=80, flags="FA")), advance=3),
           rec(eth(IP(src=SRV, dst=POOL) / TCP(sport=80, dport=40000, flags="R")), OUT)]
    yield [rec(eth(IP(src=SUB, dst=SRV) / ICMP(type=8, id=7, seq=1) / Raw(b"ping"))),
           rec(eth(IP(src=SRV, dst=POOL) / ICMP(type=0, id=7, seq=1) / Raw(b"ping")), OUT)]
    quoted = IP(src=POOL, dst=SRV) / UDP(sport=5000, dport=9)
    yield [rec(eth(IP(src=SUB, dst=SRV) / UDP(sport=5000, dport=9))),
           rec(eth(IP(src=SRV, dst=POOL) / ICMP(type=3, code=3) / bytes(quoted)[:28]), OUT, repair=True)]
    frags = fragment(IP(src=SUB, dst=SRV, id=99) / UDP(sport=6000, dport=7) / Raw(b"x" * 3000), fragsize=1000)
    yield [rec(eth(f)) for f in reversed(frags)]
    yield [rec(eth(IP(src=SRV, dst=POOL) / TCP(sport=80, dport=41000, flags="S")), OUT, advance=7)]
    yield [rec(eth(IP(src=SUB, dst=SRV) / UDP(sport=7000, dport=3478))),
           rec(eth(IP(src="100.64.0.11", dst=POOL) / UDP(sport=7001, dport=7000)))]
    yield [rec(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / Dot1Q(vlan=10) / IP(src=SUB, dst=SRV) / UDP(sport=1, dport=2))]
    yield [rec(eth(IP(src=SUB, dst=SRV, ttl=1) / UDP(sport=5000, dport=53)))]
    yield from ipv6_seeds()


# IPv6: hosts in the fuzz target's NPTv6 bindings (fd01:203:405::/48 and
# fd02:0:0:600::/56) and outside them.
HOST6, EXT6, SRV6 = "fd01:203:405:1::1234", "2001:db8:1:d550::1234", "2001:db8:ff::20"


def eth6(pkt):
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / pkt


def ipv6_seeds():
    yield [rec(eth6(IPv6(src=HOST6, dst=SRV6) / UDP(sport=5000, dport=53) / Raw(b"q"))),
           rec(eth6(IPv6(src=SRV6, dst=EXT6) / UDP(sport=53, dport=5000) / Raw(b"a")), OUT)]
    yield [rec(eth6(IPv6(src="fd02::6aa:ffff:ffff:1:2", dst=SRV6) / TCP(sport=40000, dport=80, flags="S"))),
           rec(eth6(IPv6(src="fd01:203:405:ffff::1", dst=SRV6) / ICMPv6EchoRequest(id=1))),
           rec(eth6(IPv6(src=SRV6, dst="2001:db8:1:ffff::1") / UDP(sport=1, dport=2)), OUT)]
    quoted = bytes(IPv6(src=EXT6, dst=SRV6, hlim=1) / UDP(sport=5000, dport=53))
    yield [rec(eth6(IPv6(src="2001:db8:fe::1", dst=EXT6) / ICMPv6TimeExceeded() / Raw(quoted)), OUT),
           rec(eth6(IPv6(src=HOST6, dst=SRV6) / ICMPv6DestUnreach(code=4) / Raw(bytes(IPv6(src=SRV6, dst=HOST6) / UDP()))))]
    yield [rec(eth6(IPv6(src=HOST6, dst=SRV6) / IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt() / UDP(sport=1, dport=2))),
           rec(eth6(IPv6(src=HOST6, dst=SRV6) / IPv6ExtHdrFragment(offset=10, id=5) / Raw(b"x" * 16))),
           rec(eth6(IPv6(src="fd99::1", dst=SRV6, hlim=1) / UDP(sport=1, dport=2)))]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for i, records in enumerate(seeds()):
        (out / f"seed-{i:02}").write_bytes(b"".join(records))


if __name__ == "__main__":
    main()
