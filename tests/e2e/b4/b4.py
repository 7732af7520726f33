#!/usr/bin/env python3
"""A DS-Lite B4 element (RFC 6333 section 5) in user space, for the lab.

This kernel has no ip6tnl, so the home's softwire is a TUN device and this
program: written from RFC 6333 and RFC 2473 alone, not from natrix.

- The home's IPv4 side (RFC 6333 section 5.7): TUN device DEV with
  192.0.0.2/29 and the default route via 192.0.0.1, the AFTR's well-known
  address, so every IPv4 packet of the home enters the TUN.
- Encapsulation (RFC 6333 section 5.2, RFC 2473 section 3.1): each IPv4
  packet read from the TUN is sent whole as the payload of an IPv6 packet
  with next header 4 (IPv4), source the B4's IPv6 address, destination the
  AFTR, on a raw IPv6 socket of protocol 4; the kernel writes the IPv6
  header (hop limit: the interface's default).
- Fragmentation (RFC 6333 section 5.3, RFC 2473 section 7.2): the inner
  IPv4 packet is never fragmented; an encapsulated packet over the link's
  MTU is fragmented as IPv6 by the kernel after encapsulation (the raw
  socket leaves IPV6_DONTFRAG off). The TUN's MTU (--mtu, default 1460 =
  1500 - 40) keeps packets under a 1500-byte link from needing it.
- Decapsulation (RFC 6333 section 5.2, RFC 2473 section 3.3): IPv6 packets
  with next header 4 to the B4's address arrive on the same socket, outer
  fragments already reassembled by the kernel's IPv6 layer before the
  socket sees them (RFC 6333 section 6.3: reassembly before
  decapsulation); the inner IPv4 packet is written to the TUN. Packets
  from any source other than the AFTR are dropped, and so is anything that
  is not a whole IPv4 packet.

Prints "ready" once the TUN and its routes are up; runs until SIGTERM or
SIGINT and then prints its counters to stderr. The TUN (and its routes)
vanish with the process.
"""

import argparse
import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import sys

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IPPROTO_IPIP = 4  # next header "IPv4" (RFC 2473 section 3.1)
B4_IPV4 = "192.0.0.2/29"  # RFC 6333 section 5.7
AFTR_IPV4 = "192.0.0.1"
MAX_PACKET = 65535


def open_tun(name):
    """A TUN device (no packet information header: bare IP packets)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def configure_home(dev, mtu):
    """The home's IPv4 goes into the softwire (RFC 6333 section 5.7)."""
    for argv in (["link", "set", dev, "mtu", str(mtu), "up"],
                 ["addr", "add", B4_IPV4, "dev", dev],
                 ["route", "replace", "default", "via", AFTR_IPV4, "dev", dev]):
        subprocess.run(["ip", *argv], check=True)


def open_softwire(b4):
    """The raw IPv6 socket of next header 4, bound to the B4's address so
    that only softwire packets addressed to this B4 arrive."""
    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, IPPROTO_IPIP)
    s.bind((b4, 0))
    return s


def is_ipv4_packet(p):
    """A whole IPv4 packet: version 4, header and total length inside it."""
    if len(p) < 20 or p[0] >> 4 != 4 or (p[0] & 0x0F) < 5:
        return False
    total = struct.unpack_from("!H", p, 2)[0]
    return (p[0] & 0x0F) * 4 <= total <= len(p)


def encapsulate(tun, sock, aftr, counts):
    """One IPv4 packet of the home into the softwire (RFC 6333 section 5.2)."""
    packet = os.read(tun, MAX_PACKET)
    if not is_ipv4_packet(packet):
        counts["dropped_not_ipv4"] += 1
        return
    try:
        sock.sendto(packet, (aftr, 0))
        counts["encapsulated"] += 1
    except OSError:  # e.g. the AFTR's link address not resolved: lost, as on a wire
        counts["dropped_send_failed"] += 1


def decapsulate(tun, sock, aftr_bytes, counts):
    """One softwire packet to the home, if the AFTR sent it (RFC 2473
    section 3.3); the IPv6 layer has already reassembled it."""
    packet, src = sock.recvfrom(MAX_PACKET)
    if socket.inet_pton(socket.AF_INET6, src[0].split("%")[0]) != aftr_bytes:
        counts["dropped_not_from_aftr"] += 1
    elif not is_ipv4_packet(packet):
        counts["dropped_not_ipv4"] += 1
    else:
        os.write(tun, packet[:struct.unpack_from("!H", packet, 2)[0]])
        counts["decapsulated"] += 1


def run(tun, sock, aftr, counts):
    aftr_bytes = socket.inet_pton(socket.AF_INET6, aftr)
    while True:
        ready, _, _ = select.select([tun, sock], [], [])
        if tun in ready:
            encapsulate(tun, sock, aftr, counts)
        if sock in ready:
            decapsulate(tun, sock, aftr_bytes, counts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aftr", required=True, help="the AFTR's IPv6 address")
    ap.add_argument("--b4", required=True, help="this B4's IPv6 address (on the access link)")
    ap.add_argument("--dev", default="b4", help="the TUN device's name (default b4)")
    ap.add_argument("--mtu", type=int, default=1460, help="the TUN's IPv4 MTU (default 1460)")
    args = ap.parse_args()

    counts = {"encapsulated": 0, "decapsulated": 0, "dropped_not_from_aftr": 0, "dropped_not_ipv4": 0,
              "dropped_send_failed": 0}

    def stop(_sig, _frame):
        print(" ".join(f"{k}={v}" for k, v in counts.items()), file=sys.stderr, flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    tun = open_tun(args.dev)
    sock = open_softwire(args.b4)
    configure_home(args.dev, args.mtu)
    print("ready", flush=True)
    run(tun, sock, args.aftr, counts)


if __name__ == "__main__":
    main()
