#!/usr/bin/env python3
"""Generate the synthetic subscriber capture used as natrix's replay example.

The capture is what a probe on the NAT's INSIDE link would see: frames from
many subscribers in 100.64.0.0/10 towards the gateway (the NAT), outbound only
(server replies would arrive on the outside and are not in it).  A handful of
unsolicited frames (a port scan of the pool) are written on a second pcapng
interface named ``outside`` so that a replay also exercises inbound filtering.

Traffic mix (all times relative to a fixed epoch, 2026-01-01T00:00:00Z):
  * DNS queries (A/AAAA/HTTPS, EDNS0) to 198.51.100.53:53 from random ports;
  * TCP web connections to 198.51.100.0/24 and 192.0.2.0/24, port 80 (HTTP
    GET) and 443 (TLS ClientHello, then application data): SYN, ACK, request,
    ACKs of the (invisible) response, FIN/ACK and the last ACK -- or left
    open, or reset;
  * QUIC-like UDP to port 443: a 1200-byte Initial then a few short packets;
  * ICMP echo requests (Linux- and Windows-style payloads);
  * a few large UDP datagrams (SIP INVITE with a big SDP) fragmented with
    scapy's fragment(); one of them is sent with a non-first fragment first;
  * one subscriber with a P2P-like burst (~3000 UDP flows, DHT get_peers
    queries from distinct source ports), enough to hit a per-subscriber port
    limit of 2000.

The output is deterministic for a given set of options: every random choice
comes from random.Random(seed) and every header field scapy would otherwise
randomise is set explicitly.  Checksums are left to scapy.

The pcapng writer is local (SHB, one IDB per interface with if_name and
if_tsresol = 6, EPBs with microsecond timestamps, little-endian).

Usage:
    python3 tools/gen_example_capture.py [--seed 1] [--subscribers 200]
        [--duration 120] [--out examples/subscribers.pcapng]
"""

import argparse
import ipaddress
import os
import random
import struct
import sys

try:
    from scapy.all import DNS, DNSQR, DNSRROPT, ICMP, IP, TCP, UDP, Ether, Raw, fragment
except ImportError:  # pragma: no cover
    sys.exit("scapy is required: pip install scapy")

# --------------------------------------------------------------------------
# Fixed parameters of the example network
# --------------------------------------------------------------------------

EPOCH_US = 1767225600 * 1_000_000          # 2026-01-01T00:00:00Z
FIRST_SUBSCRIBER = ipaddress.IPv4Address("100.64.0.10")
SUBSCRIBER_NET = ipaddress.IPv4Network("100.64.0.0/10")
GATEWAY_MAC = "02:00:00:00:00:01"          # NAT's inside interface
NAT_OUTSIDE_MAC = "02:00:00:00:00:02"      # NAT's outside interface
UPSTREAM_MAC = "02:00:00:00:00:fe"         # upstream router (198.51.100.254)
DNS_SERVER = "198.51.100.53"
SCANNER = "198.51.100.66"
POOL_HOSTS = [str(ipaddress.IPv4Address("203.0.113.0") + i) for i in range(16)] + ["198.51.100.10"]

# Addresses in the documentation ranges that are *not* servers in this example
# (NAT outside address, pool, resolver, scanner, gateway).
RESERVED = {"198.51.100.0", "198.51.100.1", "198.51.100.10", "198.51.100.53",
            "198.51.100.66", "198.51.100.254", "198.51.100.255",
            "192.0.2.0", "192.0.2.255"}

IF_INSIDE = 0
IF_OUTSIDE = 1

DOMAINS = ["example.com", "example.net", "example.org"]
LABELS = ["www", "api", "cdn", "img", "static", "mail", "login", "video", "news",
          "shop", "maps", "push", "update", "telemetry", "assets", "m", "media"]
PATHS = ["/", "/index.html", "/favicon.ico", "/api/v1/status", "/news/today",
         "/static/app.js", "/static/style.css", "/images/logo.png",
         "/search?q=weather", "/feed.xml", "/robots.txt", "/generate_204"]
USER_AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Linux; Android 14) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Mobile Safari/537.36",
    "curl/8.5.0",
]


# --------------------------------------------------------------------------
# Minimal pcapng writer
# --------------------------------------------------------------------------

def _pad4(b):
    return b + b"\x00" * (-len(b) % 4)


def _option(code, value):
    return struct.pack("<HH", code, len(value)) + _pad4(value)


def _block(btype, body):
    body = _pad4(body)
    total = 12 + len(body)
    return struct.pack("<II", btype, total) + body + struct.pack("<I", total)


class PcapNgWriter:
    """SHB + one IDB per interface (if_name, if_tsresol=6) + EPBs."""

    def __init__(self, f, interfaces, app="natrix tools/gen_example_capture.py"):
        self.f = f
        self.count = 0
        shb = struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)
        shb += _option(4, app.encode()) + _option(0, b"")          # shb_userappl
        f.write(_block(0x0A0D0D0A, shb))
        for name in interfaces:
            idb = struct.pack("<HHI", 1, 0, 262144)                 # LINKTYPE_ETHERNET
            idb += _option(2, name.encode())                        # if_name
            idb += _option(9, bytes([6]))                           # if_tsresol: 10^-6
            idb += _option(0, b"")
            f.write(_block(0x00000001, idb))

    def write(self, iface, ts_us, frame):
        epb = struct.pack("<IIIII", iface, (ts_us >> 32) & 0xFFFFFFFF, ts_us & 0xFFFFFFFF,
                          len(frame), len(frame)) + _pad4(frame)
        self.f.write(_block(0x00000006, epb))
        self.count += 1


# --------------------------------------------------------------------------
# Payload builders
# --------------------------------------------------------------------------

def rand_bytes(rng, n):
    return bytes(rng.getrandbits(8) for _ in range(n))


def hostname(rng):
    return "%s.%s" % (rng.choice(LABELS), rng.choice(DOMAINS))


def tls_client_hello(rng, sni):
    """A well-formed TLS 1.3 ClientHello record, padded to ~517 bytes like browsers."""
    def ext(t, data):
        return struct.pack("!HH", t, len(data)) + data

    name = sni.encode()
    sni_ext = ext(0x0000, struct.pack("!HBH", len(name) + 3, 0, len(name)) + name)
    groups = ext(0x000A, struct.pack("!H", 6) + struct.pack("!HHH", 0x001D, 0x0017, 0x0018))
    sigalgs = ext(0x000D, struct.pack("!H", 8) + struct.pack("!HHHH", 0x0403, 0x0804, 0x0401, 0x0503))
    alpn_list = b"\x02h2\x08http/1.1"
    alpn = ext(0x0010, struct.pack("!H", len(alpn_list)) + alpn_list)
    versions = ext(0x002B, b"\x04\x03\x04\x03\x03")
    keyshare = ext(0x0033, struct.pack("!HHH", 36, 0x001D, 32) + rand_bytes(rng, 32))
    ec_points = ext(0x000B, b"\x01\x00")
    exts = sni_ext + ec_points + groups + sigalgs + alpn + versions + keyshare
    suites = struct.pack("!9H", 0x1301, 0x1302, 0x1303, 0xC02B, 0xC02F, 0xC02C, 0xC030,
                         0xCCA9, 0xCCA8)
    body = (b"\x03\x03" + rand_bytes(rng, 32) + b"\x20" + rand_bytes(rng, 32)
            + struct.pack("!H", len(suites)) + suites + b"\x01\x00")
    # padding extension (RFC 7685) so that the record is 517 bytes
    fixed = len(body) + 2 + len(exts) + 4 + 5
    pad = max(0, 517 - fixed - 4)
    exts += ext(0x0015, b"\x00" * pad)
    body += struct.pack("!H", len(exts)) + exts
    hs = b"\x01" + struct.pack("!I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack("!H", len(hs)) + hs


def tls_app_data(rng, n):
    """ChangeCipherSpec + encrypted records (Finished, request)."""
    ccs = b"\x14\x03\x03\x00\x01\x01"
    fin = b"\x17\x03\x03\x00\x35" + rand_bytes(rng, 0x35)
    req = b"\x17\x03\x03" + struct.pack("!H", n) + rand_bytes(rng, n)
    return ccs + fin + req


def http_get(rng, host):
    return ("GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\n"
            "Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n\r\n"
            % (rng.choice(PATHS), host, rng.choice(USER_AGENTS))).encode()


def quic_varint(v):
    if v < 64:
        return bytes([v])
    if v < 16384:
        return struct.pack("!H", 0x4000 | v)
    return struct.pack("!I", 0x80000000 | v)


def quic_initial(rng, dcid, scid, size=1200):
    """QUIC v1 long-header Initial packet, UDP payload of exactly `size` bytes."""
    hdr = bytes([0xC3]) + b"\x00\x00\x00\x01" + bytes([len(dcid)]) + dcid + bytes([len(scid)]) + scid
    hdr += b"\x00"                                   # token length
    remaining = size - len(hdr) - 2                  # 2-byte length varint
    return hdr + quic_varint(remaining) + rand_bytes(rng, remaining)


def quic_short(rng, dcid, n):
    return bytes([0x40 | rng.getrandbits(5)]) + dcid + rand_bytes(rng, n)


def dht_get_peers(rng):
    """A BitTorrent DHT (bencoded KRPC) get_peers query."""
    return (b"d1:ad2:id20:" + rand_bytes(rng, 20) + b"9:info_hash20:" + rand_bytes(rng, 20)
            + b"e1:q9:get_peers1:t2:" + rand_bytes(rng, 2) + b"1:v4:LT\x02\x001:y1:qe")


def sip_invite(rng, src, dst, size):
    call = "%032x" % rng.getrandbits(128)
    lines = ["v=0", "o=- %d %d IN IP4 %s" % (rng.getrandbits(31), rng.getrandbits(31), src),
             "s=-", "c=IN IP4 %s" % src, "t=0 0",
             "m=audio %d RTP/AVP 0 8 9 18 101" % (rng.randrange(10000, 20000) * 2),
             "a=rtpmap:0 PCMU/8000", "a=rtpmap:8 PCMA/8000", "a=rtpmap:101 telephone-event/8000",
             "m=video %d RTP/AVP 96 97" % (rng.randrange(10000, 20000) * 2),
             "a=rtpmap:96 H264/90000", "a=rtpmap:97 VP8/90000"]
    i = 0
    while sum(len(l) + 2 for l in lines) < size - 600:
        lines.append("a=candidate:%d 1 udp %d %s %d typ host" %
                     (i, 2130706431 - i, src, rng.randrange(1024, 65535)))
        i += 1
    sdp = "\r\n".join(lines) + "\r\n"
    head = ("INVITE sip:user%d@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s:5060;branch=z9hG4bK%08x\r\n"
            "Max-Forwards: 70\r\nFrom: <sip:sub@%s>;tag=%08x\r\nTo: <sip:user%d@%s>\r\n"
            "Call-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:sub@%s:5060>\r\n"
            "Content-Type: application/sdp\r\nContent-Length: %d\r\n\r\n"
            % (rng.randrange(100, 999), dst, src, rng.getrandbits(32), src, rng.getrandbits(32),
               rng.randrange(100, 999), dst, call, src, len(sdp)))
    return (head + sdp).encode()


# --------------------------------------------------------------------------
# Generator
# --------------------------------------------------------------------------

class Subscriber:
    def __init__(self, idx, rng):
        self.idx = idx
        self.ip = str(FIRST_SUBSCRIBER + idx)
        self.mac = "02:00:00:%02x:%02x:%02x" % (1 + (idx >> 16), (idx >> 8) & 0xFF, idx & 0xFF)
        self.windows = rng.random() < 0.35
        self.ttl = 128 if self.windows else 64
        self.ephemeral = (49152, 65535) if self.windows else (32768, 60999)
        self.ipid = rng.getrandbits(16)
        self.activity = rng.choice([0.2, 0.5, 1.0, 1.0, 1.5, 2.5])   # heterogeneous users
        self.used_ports = set()

    def next_ipid(self):
        self.ipid = (self.ipid + 1) & 0xFFFF
        return self.ipid

    def port(self, rng):
        lo, hi = self.ephemeral
        while True:
            p = rng.randint(lo, hi)
            if p not in self.used_ports:
                self.used_ports.add(p)
                return p


class Capture:
    def __init__(self, duration_s):
        self.events = []          # (ts_us, seq, iface, frame bytes, kind)
        self.end_us = int(duration_s * 1_000_000)
        self.seq = 0

    def add(self, t_us, frame, kind, iface=IF_INSIDE):
        if 0 <= t_us < self.end_us:
            self.events.append((t_us, self.seq, iface, bytes(frame), kind))
            self.seq += 1
            return True
        return False


def server_addr(rng):
    while True:
        net = rng.choice(["198.51.100", "192.0.2"])
        a = "%s.%d" % (net, rng.randint(2, 250))
        if a not in RESERVED:
            return a


def peer_addr(rng):
    """Random 'internet' peer, avoiding the pool and the special hosts."""
    while True:
        net = rng.choice(["198.51.100", "192.0.2", "203.0.113"])
        last = rng.randint(1, 254)
        if net == "203.0.113" and last < 32:
            continue
        a = "%s.%d" % (net, last)
        if a not in RESERVED:
            return a


def ip_hdr(sub, dst, proto_df=True):
    return IP(src=sub.ip, dst=dst, ttl=sub.ttl, id=sub.next_ipid(), flags="DF" if proto_df else 0)


def eth(sub):
    return Ether(src=sub.mac, dst=GATEWAY_MAC)


def gen_dns(cap, rng, sub, t):
    """One lookup: A (+ AAAA from the same socket, glibc style) or HTTPS record."""
    sport = sub.port(rng)
    name = hostname(rng)
    qtypes = rng.choice([["A", "AAAA"], ["A", "AAAA"], ["A"], ["HTTPS", "A", "AAAA"]])
    n = 0
    for qt in qtypes:
        pkt = (eth(sub) / ip_hdr(sub, DNS_SERVER, proto_df=False) / UDP(sport=sport, dport=53)
               / DNS(id=rng.getrandbits(16), rd=1, ad=1, qd=DNSQR(qname=name, qtype=qt),
                     ar=DNSRROPT(rclass=1232)))
        n += cap.add(t, pkt, "dns")
        t += rng.randint(20, 400)
    return name


def gen_tcp(cap, rng, sub, t, host):
    dport = rng.choice([443, 443, 443, 80])
    dst = server_addr(rng)
    sport = sub.port(rng)
    rtt = rng.randint(5_000, 80_000)
    isn = rng.getrandbits(32)
    sisn = rng.getrandbits(32)
    win = 64240 if not sub.windows else 65535

    def seg(t, flags, seq, ack, payload=b"", window=None):
        p = eth(sub) / ip_hdr(sub, dst) / TCP(sport=sport, dport=dport, seq=seq & 0xFFFFFFFF,
                                              ack=ack & 0xFFFFFFFF if ack else 0, flags=flags,
                                              window=window or 502)
        if payload:
            p = p / Raw(load=payload)
        return cap.add(t, p, "tcp")

    syn = (eth(sub) / ip_hdr(sub, dst)
           / TCP(sport=sport, dport=dport, seq=isn, flags="S", window=win,
                 options=[("MSS", 1460), ("NOP", None), ("WScale", 8), ("NOP", None),
                          ("NOP", None), ("SAckOK", b"")]))
    cap.add(t, syn, "tcp")
    t += rtt
    cseq, sack = isn + 1, sisn + 1
    seg(t, "A", cseq, sack)
    t += rng.randint(50, 400)
    if dport == 443:
        req = tls_client_hello(rng, host)
        seg(t, "PA", cseq, sack, req)
        cseq += len(req)
        sack += rng.randint(2500, 5500)            # ServerHello..Finished
        t += rtt + rng.randint(200, 3000)
        seg(t, "A", cseq, sack)
        t += rng.randint(100, 2000)
        req = tls_app_data(rng, rng.randint(150, 700))
        seg(t, "PA", cseq, sack, req)
        cseq += len(req)
    else:
        req = http_get(rng, host)
        seg(t, "PA", cseq, sack, req)
        cseq += len(req)
    # ACKs for the response (delayed-ACK style: every two full segments)
    t += rtt
    for _ in range(rng.choice([1, 1, 2, 3, 5, 8])):
        sack += 2 * 1448
        t += rng.randint(200, 6000)
        seg(t, "A", cseq, sack)
    ending = rng.random()
    if ending < 0.85:                              # normal close after some idle time
        t += rng.randint(500_000, 25_000_000)
        seg(t, "FA", cseq, sack)
        t += rtt
        seg(t, "A", cseq + 1, sack + 1)            # ACK of the server's FIN
    elif ending < 0.92:                            # aborted
        t += rng.randint(100_000, 10_000_000)
        seg(t, "RA", cseq, sack, window=0)
    # else: left open (still established at the end of the capture)


def gen_quic(cap, rng, sub, t):
    dst = server_addr(rng)
    sport = sub.port(rng)
    dcid = rand_bytes(rng, 8)
    scid = rand_bytes(rng, 8)
    server_cid = rand_bytes(rng, 8)
    rtt = rng.randint(5_000, 80_000)

    def dgram(t, payload):
        p = eth(sub) / ip_hdr(sub, dst) / UDP(sport=sport, dport=443) / Raw(load=payload)
        return cap.add(t, p, "quic")

    dgram(t, quic_initial(rng, dcid, scid))
    t += rtt + rng.randint(100, 2000)
    for _ in range(rng.randint(2, 5)):
        dgram(t, quic_short(rng, server_cid, rng.randint(24, 90)))
        t += rng.randint(1_000, 400_000)


def gen_ping(cap, rng, sub, t):
    dst = rng.choice([server_addr(rng), DNS_SERVER, "192.0.2.1"])
    ident = rng.getrandbits(16)
    for s in range(1, rng.randint(3, 5) + 1):
        if sub.windows:
            payload = b"abcdefghijklmnopqrstuvwabcdefghi"
        else:
            ts = (EPOCH_US + t) // 1_000_000
            payload = struct.pack("<QQ", ts, (EPOCH_US + t) % 1_000_000) + bytes(range(0x10, 0x38))
        p = (eth(sub) / IP(src=sub.ip, dst=dst, ttl=sub.ttl, id=sub.next_ipid(), flags="DF")
             / ICMP(type=8, code=0, id=ident, seq=s) / Raw(load=payload))
        cap.add(t, p, "icmp")
        t += 1_000_000 + rng.randint(-2000, 2000)


def gen_fragmented(cap, rng, sub, t, out_of_order):
    dst = server_addr(rng)
    sport = 5060
    size = rng.randint(3000, 4200)
    payload = sip_invite(rng, sub.ip, dst, size)
    full = (eth(sub) / IP(src=sub.ip, dst=dst, ttl=sub.ttl, id=sub.next_ipid())
            / UDP(sport=sport, dport=5060) / Raw(load=payload))
    full = Ether(bytes(full))                      # fix lengths and the UDP checksum first
    frags = fragment(full, fragsize=1480)
    if out_of_order:
        frags = [frags[1], frags[0]] + frags[2:]  # a non-first fragment before the first
    for f in frags:
        cap.add(t, f, "fragment")
        t += rng.randint(5, 40)
    return len(frags)


def gen_p2p(cap, rng, sub, t, flows):
    """Burst of DHT queries, each from its own source port to its own peer."""
    free = [p for p in range(1024, 65536) if p not in sub.used_ports]
    ports = rng.sample(free, min(flows, len(free)))
    sub.used_ports.update(ports)
    for sport in ports:
        dst = peer_addr(rng)
        dport = rng.randint(1025, 65535)
        p = (eth(sub) / IP(src=sub.ip, dst=dst, ttl=sub.ttl, id=sub.next_ipid())
             / UDP(sport=sport, dport=dport) / Raw(load=dht_get_peers(rng)))
        cap.add(t, p, "p2p")
        t += rng.randint(1_000, 12_000)            # ~150 new flows per second


def gen_scan(cap, rng, t):
    """Unsolicited frames on the outside: SYN scan of the pool, UDP and ICMP probes."""
    sport = rng.randint(40000, 60000)
    targets = [(h, 22) for h in POOL_HOSTS[1:9]]
    targets += [("203.0.113.5", p) for p in (23, 80, 443, 3389, 8080)]
    targets += [("198.51.100.10", 22)]
    rng.shuffle(targets)

    def ip(dst):
        return IP(src=SCANNER, dst=dst, ttl=rng.randint(40, 54), id=rng.getrandbits(16))

    outer = Ether(src=UPSTREAM_MAC, dst=NAT_OUTSIDE_MAC)
    for dst, dport in targets:
        p = outer / ip(dst) / TCP(sport=sport, dport=dport, seq=rng.getrandbits(32), flags="S",
                                  window=1024, options=[("MSS", 1460)])
        cap.add(t, p, "scan", IF_OUTSIDE)
        t += rng.randint(200, 3000)
    p = outer / ip("203.0.113.3") / UDP(sport=sport, dport=161) / Raw(
        load=bytes.fromhex("302902010104067075626c6963a01c020400000001020100020100300e300c06082b060102010101000500"))
    cap.add(t, p, "scan", IF_OUTSIDE)
    t += rng.randint(200, 3000)
    p = outer / ip("203.0.113.2") / ICMP(type=8, id=rng.getrandbits(16), seq=1) / Raw(load=b"\x00" * 32)
    cap.add(t, p, "scan", IF_OUTSIDE)


def generate(seed, n_subscribers, duration, p2p_flows):
    rng = random.Random(seed)
    cap = Capture(duration)
    dur_us = cap.end_us
    if n_subscribers < 1 or n_subscribers > SUBSCRIBER_NET.num_addresses - 12:
        sys.exit("--subscribers must be between 1 and %d" % (SUBSCRIBER_NET.num_addresses - 12))
    subs = [Subscriber(i, rng) for i in range(n_subscribers)]

    # Per-subscriber sessions as a Poisson process: one "browsing session" every
    # ~50 s on average (scaled by the subscriber's activity), each a DNS lookup
    # followed by web or QUIC connections; pings and stray lookups now and then.
    for sub in subs:
        rate = sub.activity / 50.0                          # sessions per second
        t = int(rng.expovariate(rate) * 1e6) if rate else dur_us
        while t < dur_us:
            host = gen_dns(cap, rng, sub, t)
            tt = t + rng.randint(5_000, 60_000)             # resolver RTT
            for _ in range(rng.choice([1, 1, 2, 3])):
                if rng.random() < 0.3:
                    gen_quic(cap, rng, sub, tt)
                else:
                    gen_tcp(cap, rng, sub, tt, host)
                tt += rng.randint(1_000, 300_000)
            if rng.random() < 0.3:                          # background lookup
                gen_dns(cap, rng, sub, t + rng.randint(0, 5_000_000))
            t += int(rng.expovariate(rate) * 1e6)
        if rng.random() < 0.15:
            gen_ping(cap, rng, sub, rng.randint(0, max(1, dur_us - 5_000_000)))

    # A few fragmented UDP datagrams, one with a non-first fragment sent first.
    n_frag = min(5, n_subscribers)
    for k, sub in enumerate(rng.sample(subs, n_frag)):
        gen_fragmented(cap, rng, sub, rng.randint(0, max(1, dur_us - 1_000_000)), out_of_order=(k == 0))

    # The P2P subscriber: a burst starting ~1/4 into the capture.
    if p2p_flows:
        p2p = subs[min(n_subscribers - 1, 42)]
        gen_p2p(cap, rng, p2p, dur_us // 4, p2p_flows)

    # Unsolicited inbound frames on the outside interface.
    gen_scan(cap, rng, dur_us // 3)

    cap.events.sort(key=lambda e: (e[0], e[1]))
    return cap, subs


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--subscribers", type=int, default=200, help="number of subscribers (default 200)")
    ap.add_argument("--duration", type=float, default=120.0, help="capture length in seconds (default 120)")
    ap.add_argument("--p2p-flows", type=int, default=3000,
                    help="UDP flows opened by the P2P subscriber (default 3000, 0 = none)")
    ap.add_argument("--out", default=os.path.join(here, "..", "examples", "subscribers.pcapng"),
                    help="output pcapng (default examples/subscribers.pcapng)")
    args = ap.parse_args()
    if args.duration <= 0:
        ap.error("--duration must be positive")

    cap, subs = generate(args.seed, args.subscribers, args.duration, args.p2p_flows)
    out = os.path.normpath(args.out)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    counts = {}
    with open(out, "wb") as f:
        w = PcapNgWriter(f, ["inside", "outside"])
        for ts, _, iface, frame, kind in cap.events:
            w.write(iface, EPOCH_US + ts, frame)
            counts[kind] = counts.get(kind, 0) + 1
    print("wrote %s: %d frames, %d bytes, %d subscribers" %
          (out, w.count, os.path.getsize(out), len(subs)))
    for k in sorted(counts):
        print("  %-9s %6d" % (k, counts[k]))


if __name__ == "__main__":
    main()
