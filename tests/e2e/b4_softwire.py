"""A user-space DS-Lite B4 (RFC 6333 section 5) for the lab, where the
kernel has no ip6tnl: a TUN device carries the home's IPv4, and each IPv4
packet read from it is sent to the AFTR as the payload of an IPv6 packet
with next header 4 (IPv4 in IPv6, RFC 2473 section 3) over a raw IPv6
socket; IPv4-in-IPv6 packets from the AFTR are written back to the TUN
device. The kernel builds the outer header (source: the B4's address on
the link) and reassembles outer fragments before the raw socket sees them.

Usage, inside a network namespace, as root:
    python3 b4_softwire.py --aftr 2001:db8:1::af --tun b4tun --inner 192.0.0.2/29 --mtu 1460

Sets the TUN device up with the inner address (RFC 6333 section 5.7:
192.0.0.2, the AFTR being 192.0.0.1) and makes it the IPv4 default route;
prints "ready" once it forwards; SIGTERM ends it (the device and its
routes go with it).
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
IPPROTO_IPIP = 4


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def ip(*argv):
    subprocess.run(["ip", *argv], check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aftr", required=True, help="the AFTR's IPv6 address")
    p.add_argument("--tun", default="b4tun")
    p.add_argument("--inner", default="192.0.0.2/29", help="the home's IPv4 address on the TUN device")
    p.add_argument("--mtu", type=int, default=1460, help="TUN MTU: the softwire's 1500 less the 40-byte IPv6 header")
    a = p.parse_args()

    tun = open_tun(a.tun)
    ip("addr", "add", a.inner, "dev", a.tun)
    ip("link", "set", a.tun, "mtu", str(a.mtu), "up")
    ip("route", "replace", "default", "dev", a.tun)
    raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, IPPROTO_IPIP)
    aftr = socket.inet_pton(socket.AF_INET6, a.aftr)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    print("ready", flush=True)
    while not stop:
        try:
            readable, _, _ = select.select([tun, raw], [], [], 0.2)
        except InterruptedError:
            continue
        if tun in readable:
            packet = os.read(tun, 65535)
            # Only IPv4 goes into the softwire (the TUN device also sees the kernel's IPv6 chatter).
            if packet and packet[0] >> 4 == 4:
                raw.sendto(packet, (a.aftr, 0))
        if raw in readable:
            packet, sender = raw.recvfrom(65535)
            # RFC 6333 section 5.2: accept decapsulated packets from the AFTR only.
            if socket.inet_pton(socket.AF_INET6, sender[0]) == aftr and packet and packet[0] >> 4 == 4:
                os.write(tun, packet)
    os.close(tun)
    return 0


if __name__ == "__main__":
    sys.exit(main())
