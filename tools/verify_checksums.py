#!/usr/bin/env python3
"""Verifies every IPv4, TCP, UDP and ICMP checksum in a capture with scapy,
independently of natrix's own code, including the IPv4 header quoted inside
ICMP errors. Exits 1 and lists the bad frames if any checksum is wrong.

usage: tools/verify_checksums.py CAPTURE.pcapng
"""

import sys

from scapy.all import ICMP, IP, TCP, UDP, IPerror, rdpcap
from scapy.utils import checksum


def ip_header_ok(ip):
    raw = bytes(ip)[: ip.ihl * 4]
    return checksum(raw) == 0


def l4_ok(ip):
    """True when the transport checksum verifies (or may not be checked)."""
    if ip.frag != 0 or ip.flags.MF:
        return True  # a fragment's transport checksum covers the whole datagram
    payload = bytes(ip.payload)[: ip.len - ip.ihl * 4]
    if ip.proto == 1:
        return checksum(payload) == 0
    if ip.proto in (6, 17):
        if ip.proto == 17 and payload[6:8] == b"\x00\x00":
            return True  # UDP checksum not used (RFC 768)
        pseudo = bytes(IP(src=ip.src, dst=ip.dst))[12:20] + bytes([0, ip.proto]) + len(payload).to_bytes(2, "big")
        return checksum(pseudo + payload) == 0
    return True


def check(pkt):
    if IP not in pkt:
        return []
    ip = pkt[IP]
    problems = []
    if not ip_header_ok(ip):
        problems.append("IPv4 header checksum")
    if not l4_ok(ip):
        problems.append({1: "ICMP", 6: "TCP", 17: "UDP"}.get(ip.proto, "L4") + " checksum")
    if ICMP in pkt and IPerror in pkt and not ip_header_ok(pkt[IPerror]):
        problems.append("quoted IPv4 header checksum")
    return problems


def main():
    bad = 0
    packets = rdpcap(sys.argv[1])
    for n, pkt in enumerate(packets, 1):
        problems = check(pkt)
        if problems:
            bad += 1
            print(f"frame {n}: bad {', '.join(problems)}: {pkt.summary()}")
    print(f"{len(packets)} frames checked, {bad} with bad checksums")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
