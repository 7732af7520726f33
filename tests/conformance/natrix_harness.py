"""Independent test harness for natrix replay conformance tests.

Everything here is written from docs/REPLAY-CONTRACT.md and the RFCs, never from
natrix's source: a tiny pcapng writer/reader, packet builders (scapy), an
independent checksum verifier and helpers to query replay output.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import subprocess
from collections import namedtuple
from pathlib import Path

from scapy.all import (  # noqa: F401  (re-exported for the tests)
    ARP,
    ICMP,
    IP,
    TCP,
    UDP,
    Dot1Q,
    Ether,
    Raw,
    defragment,
    fragment,
)
from scapy.utils import checksum

# ---------------------------------------------------------------------------
# Addresses used throughout the suite
# ---------------------------------------------------------------------------

T0 = 1000.0

INSIDE_ADDR = "100.64.0.1"  # contract default [inside] address = "100.64.0.1/10"
SUB_A = "100.64.0.10"
SUB_B = "100.64.0.11"
SUB_C = "100.64.0.12"
SUB_D = "100.64.0.13"
SRV1 = "198.51.100.20"
SRV2 = "198.51.100.21"
SRV3 = "192.0.2.30"
POOL1 = "203.0.113.1"
POOL28 = "203.0.113.0/28"

NAT_IN_MAC = "02:00:00:00:01:01"   # natrix inside interface
NAT_OUT_MAC = "02:00:00:00:02:01"  # natrix outside interface
GW_MAC = "02:00:00:00:02:fe"       # upstream router on the outside


def mac_for(ip: str) -> str:
    """A stable locally administered MAC for a subscriber address."""
    b = socket.inet_aton(ip)
    return "02:10:%02x:%02x:%02x:%02x" % (b[0], b[1], b[2], b[3])


def in_net(ip: str, net: str) -> bool:
    return ipaddress.ip_address(ip) in ipaddress.ip_network(net, strict=False)


# ---------------------------------------------------------------------------
# pcapng writer / reader (little-endian, microsecond resolution by default)
# ---------------------------------------------------------------------------

LINKTYPE_ETHERNET = 1
SHB_TYPE = 0x0A0D0D0A
IDB_TYPE = 0x00000001
SPB_TYPE = 0x00000003
EPB_TYPE = 0x00000006
OPB_TYPE = 0x00000002
BYTE_ORDER_MAGIC = 0x1A2B3C4D


def _pad4(b: bytes) -> bytes:
    return b + b"\x00" * ((4 - len(b) % 4) % 4)


def _block(btype: int, body: bytes) -> bytes:
    body = _pad4(body)
    total = 12 + len(body)
    return struct.pack("<II", btype, total) + body + struct.pack("<I", total)


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + _pad4(value)


def write_pcapng(path, frames, ifnames=("inside", "outside")):
    """Write frames [(ts_seconds, ifname, bytes_or_scapy_pkt)] to a pcapng file.

    One SHB, one IDB per name in ``ifnames`` (linktype Ethernet, if_name option
    code 2, default microsecond resolution), one EPB per frame.
    """
    index = {name: i for i, name in enumerate(ifnames)}
    out = bytearray()
    out += _block(SHB_TYPE, struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1))
    for name in ifnames:
        opts = _option(2, name.encode()) + struct.pack("<HH", 0, 0)
        out += _block(IDB_TYPE, struct.pack("<HHI", LINKTYPE_ETHERNET, 0, 262144) + opts)
    for ts, ifname, pkt in frames:
        data = bytes(pkt)
        ticks = int(round(ts * 1_000_000))
        hdr = struct.pack(
            "<IIIII", index[ifname], (ticks >> 32) & 0xFFFFFFFF, ticks & 0xFFFFFFFF, len(data), len(data)
        )
        out += _block(EPB_TYPE, hdr + data)
    Path(path).write_bytes(bytes(out))


def _tsresol_to_divisor(v: int) -> int:
    if v & 0x80:
        return 2 ** (v & 0x7F)
    return 10 ** v


def read_pcapng(path):
    """Read a pcapng file -> list of (ts_seconds, if_name, bytes).

    Interface ids are mapped to their if_name (or "if<N>" when absent); handles
    either byte order, multiple sections, if_tsresol, EPB, SPB and OPB.
    """
    data = Path(path).read_bytes()
    pos = 0
    res = []
    endian = "<"
    ifaces = []  # list of (name, divisor) for the current section
    while pos + 12 <= len(data):
        raw_type = data[pos:pos + 4]
        if struct.unpack("<I", raw_type)[0] == SHB_TYPE:
            magic_bytes = data[pos + 8:pos + 12]
            if struct.unpack("<I", magic_bytes)[0] == BYTE_ORDER_MAGIC:
                endian = "<"
            elif struct.unpack(">I", magic_bytes)[0] == BYTE_ORDER_MAGIC:
                endian = ">"
            else:
                raise ValueError("bad pcapng byte-order magic")
            ifaces = []
        btype, blen = struct.unpack(endian + "II", data[pos:pos + 8])
        if blen < 12 or pos + blen > len(data):
            raise ValueError(f"bad pcapng block length {blen} at offset {pos}")
        trailer = struct.unpack(endian + "I", data[pos + blen - 4:pos + blen])[0]
        if trailer != blen:
            raise ValueError(f"pcapng block length mismatch at offset {pos}")
        body = data[pos + 8:pos + blen - 4]
        if btype == IDB_TYPE:
            linktype, _res, _snap = struct.unpack(endian + "HHI", body[:8])
            name = None
            divisor = 1_000_000
            op = 8
            while op + 4 <= len(body):
                code, olen = struct.unpack(endian + "HH", body[op:op + 4])
                val = body[op + 4:op + 4 + olen]
                op += 4 + olen + ((4 - olen % 4) % 4)
                if code == 0:
                    break
                if code == 2:
                    name = val.split(b"\x00")[0].decode()
                elif code == 9 and olen >= 1:
                    divisor = _tsresol_to_divisor(val[0])
            ifaces.append((name if name is not None else f"if{len(ifaces)}", divisor, linktype))
        elif btype == EPB_TYPE:
            ifid, tsh, tsl, caplen, _origlen = struct.unpack(endian + "IIIII", body[:20])
            frame = body[20:20 + caplen]
            name, divisor, _lt = ifaces[ifid]
            res.append((((tsh << 32) | tsl) / divisor, name, bytes(frame)))
        elif btype == OPB_TYPE:
            ifid, _drops, tsh, tsl, caplen, _origlen = struct.unpack(endian + "HHIIII", body[:20])
            name, divisor, _lt = ifaces[ifid]
            res.append((((tsh << 32) | tsl) / divisor, name, bytes(body[20:20 + caplen])))
        elif btype == SPB_TYPE:
            (origlen,) = struct.unpack(endian + "I", body[:4])
            name, _d, _lt = ifaces[0]
            res.append((None, name, bytes(body[4:4 + origlen])))
        pos += blen
    if pos != len(data):
        raise ValueError("trailing garbage in pcapng file")
    return res


def read_pcapng_interfaces(path):
    """Return the list of interface names (in id order) of the first section."""
    return [n for n, _ in read_pcapng_interface_info(path)]


def read_pcapng_interface_info(path):
    """[(if_name, linktype)] of the first section, in interface-id order."""
    data = Path(path).read_bytes()
    pos = 0
    names = []
    while pos + 12 <= len(data):
        btype, blen = struct.unpack("<II", data[pos:pos + 8])
        if btype == IDB_TYPE:
            body = data[pos + 8:pos + blen - 4]
            op = 8
            name = None
            while op + 4 <= len(body):
                code, olen = struct.unpack("<HH", body[op:op + 4])
                val = body[op + 4:op + 4 + olen]
                op += 4 + olen + ((4 - olen % 4) % 4)
                if code == 0:
                    break
                if code == 2:
                    name = val.split(b"\x00")[0].decode()
            names.append((name, struct.unpack("<H", body[:2])[0]))
        pos += blen
    return names


# ---------------------------------------------------------------------------
# Independent checksum verification
# ---------------------------------------------------------------------------

ICMP_ERROR_TYPES = (3, 4, 5, 11, 12)


def ip_offset(raw: bytes):
    """Offset of the IPv4 header in an Ethernet frame (802.1Q/QinQ aware), or None."""
    if len(raw) < 14:
        return None
    off = 12
    etype = struct.unpack("!H", raw[off:off + 2])[0]
    off += 2
    while etype in (0x8100, 0x88A8, 0x9100):
        if len(raw) < off + 4:
            return None
        etype = struct.unpack("!H", raw[off + 2:off + 4])[0]
        off += 4
    return off if etype == 0x0800 else None


def _pseudo(src: bytes, dst: bytes, proto: int, length: int) -> bytes:
    return src + dst + bytes([0, proto]) + struct.pack("!H", length)


def l4_checksum_ok(src_b: bytes, dst_b: bytes, proto: int, seg: bytes) -> bool:
    return checksum(_pseudo(src_b, dst_b, proto, len(seg)) + seg) == 0


def verify_ipv4_checksums(ipb: bytes, where: str = "frame"):
    """Verify all checksums of one IPv4 packet (bytes starting at the IP header).

    Raises AssertionError with a message on failure. Returns a dict with facts.
    """
    assert len(ipb) >= 20, f"{where}: IPv4 header truncated"
    ver, ihl = ipb[0] >> 4, ipb[0] & 0xF
    assert ver == 4, f"{where}: not IPv4 (version {ver})"
    assert ihl >= 5 and len(ipb) >= ihl * 4, f"{where}: bad IHL {ihl}"
    tot = struct.unpack("!H", ipb[2:4])[0]
    assert ihl * 4 <= tot <= len(ipb), f"{where}: bad total length {tot} (have {len(ipb)})"
    assert checksum(ipb[:ihl * 4]) == 0, f"{where}: bad IPv4 header checksum"
    ipb = ipb[:tot]
    flags_frag = struct.unpack("!H", ipb[6:8])[0]
    more_frags = bool(flags_frag & 0x2000)
    frag_off = flags_frag & 0x1FFF
    proto = ipb[9]
    src_b, dst_b = ipb[12:16], ipb[16:20]
    seg = ipb[ihl * 4:]
    facts = {"proto": proto, "fragment": more_frags or frag_off != 0}
    if more_frags or frag_off:
        # The L4 checksum of a fragment covers the whole datagram; it is
        # checked after reassembly by the fragment tests.
        return facts
    if proto == 6:
        assert len(seg) >= 20, f"{where}: TCP header truncated"
        assert l4_checksum_ok(src_b, dst_b, 6, seg), f"{where}: bad TCP checksum"
    elif proto == 17:
        assert len(seg) >= 8, f"{where}: UDP header truncated"
        ck = struct.unpack("!H", seg[6:8])[0]
        if ck != 0:
            assert l4_checksum_ok(src_b, dst_b, 17, seg), f"{where}: bad UDP checksum"
        facts["udp_zero_checksum"] = ck == 0
    elif proto == 1:
        assert len(seg) >= 8, f"{where}: ICMP header truncated"
        assert checksum(seg) == 0, f"{where}: bad ICMP checksum"
        if seg[0] in ICMP_ERROR_TYPES:
            emb = seg[8:]
            if len(emb) >= 20:
                eihl = emb[0] & 0xF
                assert emb[0] >> 4 == 4, f"{where}: embedded packet not IPv4"
                if eihl >= 5 and len(emb) >= eihl * 4:
                    assert checksum(emb[:eihl * 4]) == 0, f"{where}: bad embedded IPv4 header checksum"
                    verify_embedded_transport(emb, where)
    return facts


def verify_embedded_transport(emb: bytes, where: str = "frame"):
    """When the packet embedded in an ICMP error is complete (its total length
    equals the bytes present, RFC 792 allows less) and not a fragment, its
    transport checksum must be valid too: a NAT that rewrites the embedded
    addresses/ports must update it (RFC 5508 sec 4.2/4.3; a zero UDP checksum
    stays zero)."""
    eihl = (emb[0] & 0xF) * 4
    etot = struct.unpack("!H", emb[2:4])[0]
    if etot != len(emb) or etot < eihl:
        return
    if struct.unpack("!H", emb[6:8])[0] & 0x3FFF:
        return
    proto = emb[9]
    seg = emb[eihl:]
    src_b, dst_b = emb[12:16], emb[16:20]
    if proto == 6 and len(seg) >= 20:
        assert l4_checksum_ok(src_b, dst_b, 6, seg), f"{where}: bad embedded TCP checksum"
    elif proto == 17 and len(seg) >= 8:
        if struct.unpack("!H", seg[6:8])[0] != 0:
            assert l4_checksum_ok(src_b, dst_b, 17, seg), f"{where}: bad embedded UDP checksum"
    elif proto == 1 and len(seg) >= 8 and seg[0] not in ICMP_ERROR_TYPES:
        assert checksum(seg) == 0, f"{where}: bad embedded ICMP checksum"


def verify_output_fragments(frames):
    """Group the output fragments (per side, source, destination, protocol and IP
    id); every complete set is reassembled here and its transport checksum
    (which covers the whole datagram) verified.

    ``frames`` is a list of (side, raw_frame)."""
    groups = {}
    for side, raw in frames:
        off = ip_offset(raw)
        if off is None:
            continue
        ipb = raw[off:]
        tot = struct.unpack("!H", ipb[2:4])[0]
        ipb = ipb[:tot]
        ff = struct.unpack("!H", ipb[6:8])[0]
        if not ff & 0x3FFF:
            continue
        key = (side, ipb[12:16], ipb[16:20], ipb[9], ipb[4:6])
        ihl = (ipb[0] & 0xF) * 4
        groups.setdefault(key, []).append(((ff & 0x1FFF) * 8, bool(ff & 0x2000), ipb[ihl:]))
    for (side, src_b, dst_b, proto, ipid), parts in groups.items():
        parts.sort(key=lambda x: x[0])
        if parts[0][0] != 0 or parts[-1][1]:
            continue  # incomplete set (e.g. a fragment natrix legitimately dropped)
        seg = b""
        ok = True
        for off, _mf, data in parts:
            if off != len(seg):
                ok = False
                break
            seg += data
        if not ok:
            continue
        where = f"reassembled output datagram ({side}, id 0x{ipid.hex()})"
        if proto == 6:
            assert l4_checksum_ok(src_b, dst_b, 6, seg), f"{where}: bad TCP checksum"
        elif proto == 17 and struct.unpack("!H", seg[6:8])[0] != 0:
            assert l4_checksum_ok(src_b, dst_b, 17, seg), f"{where}: bad UDP checksum"
        elif proto == 1:
            assert checksum(seg) == 0, f"{where}: bad ICMP checksum"


def verify_frame_checksums(raw: bytes, where: str = "frame"):
    off = ip_offset(raw)
    assert off is not None, f"{where}: natrix emitted a non-IPv4 frame: {raw[:32].hex()}"
    return verify_ipv4_checksums(raw[off:], where)


# ---------------------------------------------------------------------------
# Packet builders
# ---------------------------------------------------------------------------


def eth_in(src_ip: str):
    """Ethernet header of a frame arriving on the inside from a subscriber."""
    return Ether(src=mac_for(src_ip), dst=NAT_IN_MAC)


def eth_out():
    """Ethernet header of a frame arriving on the outside from the upstream router."""
    return Ether(src=GW_MAC, dst=NAT_OUT_MAC)


def raw_in(src_ip: str, ip_raw: bytes):
    """A frame arriving on the inside whose IPv4 bytes are given verbatim."""
    return Ether(src=mac_for(src_ip), dst=NAT_IN_MAC, type=0x0800) / Raw(bytes(ip_raw))


def raw_out(ip_raw: bytes):
    """A frame arriving on the outside whose IPv4 bytes are given verbatim."""
    return Ether(src=GW_MAC, dst=NAT_OUT_MAC, type=0x0800) / Raw(bytes(ip_raw))


def udp_out(src, sport, dst, dport, payload=b"hello", ttl=64, chksum=None, ipid=1):
    u = UDP(sport=sport, dport=dport) if chksum is None else UDP(sport=sport, dport=dport, chksum=chksum)
    return eth_in(src) / IP(src=src, dst=dst, ttl=ttl, id=ipid) / u / Raw(payload)


def udp_in(src, sport, dst, dport, payload=b"reply", ttl=64, chksum=None, ipid=2):
    u = UDP(sport=sport, dport=dport) if chksum is None else UDP(sport=sport, dport=dport, chksum=chksum)
    return eth_out() / IP(src=src, dst=dst, ttl=ttl, id=ipid) / u / Raw(payload)


def tcp_out(src, sport, dst, dport, flags="S", seq=1000, ack=0, payload=b"", ttl=64):
    p = eth_in(src) / IP(src=src, dst=dst, ttl=ttl) / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, window=65535)
    return p / Raw(payload) if payload else p


def tcp_in(src, sport, dst, dport, flags="SA", seq=5000, ack=0, payload=b"", ttl=64):
    p = eth_out() / IP(src=src, dst=dst, ttl=ttl) / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, window=65535)
    return p / Raw(payload) if payload else p


def echo_out(src, dst, ident, seq=1, payload=b"ping", ttl=64):
    return eth_in(src) / IP(src=src, dst=dst, ttl=ttl) / ICMP(type=8, code=0, id=ident, seq=seq) / Raw(payload)


def echo_reply_in(src, dst, ident, seq=1, payload=b"ping", ttl=64):
    return eth_out() / IP(src=src, dst=dst, ttl=ttl) / ICMP(type=0, code=0, id=ident, seq=seq) / Raw(payload)


def ip_bytes(pkt) -> bytes:
    """The IPv4 packet (header + payload up to total length) of a frame."""
    raw = getattr(pkt, "original", None) or bytes(pkt)
    off = ip_offset(raw)
    assert off is not None
    ipb = raw[off:]
    tot = struct.unpack("!H", ipb[2:4])[0]
    return ipb[:tot]


def icmp_error(eth, src, dst, embedded: bytes, icmp_type=3, code=3, ttl=64, icmp_chksum=None):
    """An ICMP error carrying ``embedded`` (raw bytes of the offending packet)."""
    ic = ICMP(type=icmp_type, code=code) if icmp_chksum is None else ICMP(type=icmp_type, code=code, chksum=icmp_chksum)
    return eth / IP(src=src, dst=dst, ttl=ttl) / ic / Raw(embedded)


# ---------------------------------------------------------------------------
# Decoding helpers for natrix output
# ---------------------------------------------------------------------------

Out = namedtuple("Out", "ts side pkt")


def raw_of(o) -> bytes:
    pkt = o.pkt if isinstance(o, Out) else o
    return pkt.original


def l4_data(pkt) -> bytes:
    """Application payload of a (non-fragmented) UDP/TCP packet, via the IP total length."""
    ipb = ip_bytes(pkt)
    ihl = ipb[0] & 0xF
    seg = ipb[ihl * 4:]
    if ipb[9] == 17:
        return seg[8:]
    if ipb[9] == 6:
        return seg[(seg[12] >> 4) * 4:]
    if ipb[9] == 1:
        return seg[8:]
    return seg


class Embedded:
    """The packet embedded in an ICMP error, decoded from raw bytes."""

    def __init__(self, emb: bytes):
        self.raw = emb
        self.ihl = emb[0] & 0xF
        self.hdr = emb[:self.ihl * 4]
        self.ip = IP(self.hdr)  # scapy decoder for the header fields
        self.l4 = emb[self.ihl * 4:]
        self.proto = emb[9]
        self.src = self.ip.src
        self.dst = self.ip.dst
        self.sport = self.dport = None
        if self.proto in (6, 17) and len(self.l4) >= 4:
            self.sport, self.dport = struct.unpack("!HH", self.l4[:4])
        self.icmp_id = None
        if self.proto == 1 and len(self.l4) >= 6:
            self.icmp_id = struct.unpack("!H", self.l4[4:6])[0]

    @property
    def header_checksum_ok(self):
        return checksum(self.hdr) == 0

    @property
    def complete(self):
        return struct.unpack("!H", self.raw[2:4])[0] == len(self.raw)

    def transport_checksum_ok(self):
        seg = self.l4
        if self.proto == 1:
            return checksum(seg) == 0
        return l4_checksum_ok(self.hdr[12:16], self.hdr[16:20], self.proto, seg)

    @property
    def udp_checksum(self):
        return struct.unpack("!H", self.l4[6:8])[0]


def icmp_info(pkt):
    """(type, code, Embedded|None) for an ICMP packet."""
    ipb = ip_bytes(pkt)
    ihl = ipb[0] & 0xF
    seg = ipb[ihl * 4:]
    emb = Embedded(seg[8:]) if seg[0] in ICMP_ERROR_TYPES and len(seg) >= 28 else None
    return seg[0], seg[1], emb


def is_udp(p):
    return IP in p and p[IP].proto == 17 and UDP in p


def is_tcp(p):
    return IP in p and p[IP].proto == 6 and TCP in p


def is_icmp(p):
    return IP in p and p[IP].proto == 1 and ICMP in p


def is_icmp_error(p):
    return is_icmp(p) and p[ICMP].type in ICMP_ERROR_TYPES


def has_payload(data: bytes):
    return lambda p: (is_udp(p) or is_tcp(p)) and not _is_frag(p) and l4_data(p) == data


def _is_frag(p):
    return IP in p and (p[IP].flags.MF or p[IP].frag != 0)


def tcp_seq(seq, flags=None):
    def f(p):
        if not is_tcp(p) or p[TCP].seq != seq:
            return False
        return flags is None or str(p[TCP].flags) == flags
    return f


def echo_with(icmp_type, seq):
    return lambda p: is_icmp(p) and p[ICMP].type == icmp_type and p[ICMP].seq == seq


def dump(outs) -> str:
    lines = []
    for o in outs:
        lines.append(f"  {o.ts:.6f} {o.side:7s} {o.pkt.summary()}")
    return "\n".join(lines) if lines else "  (no output frames)"


def pick(outs, side=None, where=lambda p: True):
    return [o for o in outs if (side is None or o.side == side) and where(o.pkt)]


def one(outs, side, where, what="frame"):
    r = pick(outs, side, where)
    assert len(r) == 1, f"expected exactly one {what} on {side}, got {len(r)}; output was:\n{dump(outs)}"
    return r[0]


def none_of(outs, side, where, what="frame"):
    r = pick(outs, side, where)
    assert not r, f"expected no {what} on {side}, got {len(r)}; output was:\n{dump(outs)}"


# ---------------------------------------------------------------------------
# Config builder
# ---------------------------------------------------------------------------


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def make_config(pool=(POOL1 + "/32",), nat=None, timeouts=None, fragments=None, inside=None, outside=None):
    """Build a natrix TOML config. ``nat`` etc. are dicts of extra keys."""
    lines = []
    if inside:
        lines.append("[inside]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in inside.items()]
    if outside:
        lines.append("[outside]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in outside.items()]
    lines.append("[nat]")
    lines.append(f"pool = {_toml_value(list(pool))}")
    for k, v in (nat or {}).items():
        lines.append(f"{k} = {_toml_value(v)}")
    if timeouts:
        lines.append("[timeouts]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in timeouts.items()]
    if fragments:
        lines.append("[fragments]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in fragments.items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Running natrix
# ---------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def natrix_bin_path() -> Path:
    env = os.environ.get("NATRIX_BIN")
    if env:
        return Path(env)
    target = os.environ.get("CARGO_TARGET_DIR")
    base = Path(target) if target else REPO_ROOT / "target"
    return base / "debug" / "natrix"


_run_counter = [0]


def new_run_dir(tmp_path) -> Path:
    _run_counter[0] += 1
    d = Path(tmp_path) / f"run{_run_counter[0]}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def run_natrix(args, binary=None, timeout=120):
    """Run the natrix binary with ``args``; returns the CompletedProcess."""
    binary = Path(binary) if binary else natrix_bin_path()
    return subprocess.run([str(binary)] + [str(a) for a in args], capture_output=True, timeout=timeout)


def proc_text(proc) -> str:
    return proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")


def check_output_capture(outp):
    """Contract: OUT is pcapng with exactly two Ethernet interfaces, id 0
    ``inside`` and id 1 ``outside``; returns [(ts, side, raw)]."""
    ifs = read_pcapng_interface_info(outp)
    assert [n for n, _ in ifs] == ["inside", "outside"], f"output interfaces must be [inside, outside], got {ifs}"
    assert all(lt == LINKTYPE_ETHERNET for _, lt in ifs), f"output link types must be Ethernet: {ifs}"
    return read_pcapng(outp)


def decode_outputs(recs, check_checksums=True):
    """[(ts, side, raw)] -> [Out]; verifies every frame's checksums (IPv4 header,
    TCP/UDP/ICMP, embedded headers of ICMP errors, reassembled fragments)."""
    outs = []
    for i, (ts, side, raw) in enumerate(recs):
        pkt = Ether(raw)
        pkt.original = raw
        if check_checksums:
            verify_frame_checksums(raw, where=f"output frame #{i} ({side}, {pkt.summary()})")
        outs.append(Out(ts, side, pkt))
    if check_checksums:
        verify_output_fragments([(side, raw) for _, side, raw in recs])
    return outs


def run_replay_files(config_toml_text, frames, tmp_path, binary=None, writer=None):
    """Write config and input capture, run ``natrix replay``; returns
    (proc, dir) where dir holds c.toml, in.*, out.pcapng and r.json."""
    d = new_run_dir(tmp_path)
    cfg, outp, rep = d / "c.toml", d / "out.pcapng", d / "r.json"
    cfg.write_text(config_toml_text)
    if writer is None:
        for ts, side, _p in frames:
            assert side in ("inside", "outside"), side
        inp = d / "in.pcapng"
        write_pcapng(inp, [(ts, side, pkt) for ts, side, pkt in frames])
    else:
        inp = writer(d, frames)
    proc = run_natrix(["replay", "--config", cfg, "--in", inp, "--out", outp, "--report", rep, "--quiet"],
                      binary=binary)
    return proc, d


def run_replay(config_toml_text, frames, tmp_path, binary=None, check_checksums=True, expect_ok=True, writer=None):
    """Run ``natrix replay`` on ``frames`` [(ts, 'inside'|'outside', scapy Ether)].

    Returns (list of Out(ts, side, Ether), report dict). Every output frame has
    its checksums verified independently unless check_checksums=False.
    """
    proc, d = run_replay_files(config_toml_text, frames, tmp_path, binary=binary, writer=writer)
    if not expect_ok:
        return proc
    assert proc.returncode == 0, (
        f"natrix replay exited {proc.returncode}\nconfig:\n{config_toml_text}\n"
        f"output:\n{proc_text(proc)}"
    )
    outs = decode_outputs(check_output_capture(d / "out.pcapng"), check_checksums=check_checksums)
    report = json.loads((d / "r.json").read_text())
    return outs, report


def write_pcap(path, frames, nanos=False):
    """Classic libpcap file (little-endian, Ethernet) of [(ts, side, pkt)]; the
    side is not representable, so all frames arrive inside (contract)."""
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = bytearray(struct.pack("<IHHiIII", magic, 2, 4, 0, 0, 262144, LINKTYPE_ETHERNET))
    for ts, _side, pkt in frames:
        data = bytes(pkt)
        sec = int(ts)
        frac = int(round((ts - sec) * (1e9 if nanos else 1e6)))
        out += struct.pack("<IIII", sec, frac, len(data), len(data)) + data
    Path(path).write_bytes(bytes(out))


class Scenario:
    """Accumulates input frames; can be run repeatedly as it grows.

    natrix is deterministic, so a longer run reproduces the mappings observed in
    a shorter run of the same prefix: tests observe a translation, then build
    replies towards the observed external address/port.
    """

    def __init__(self, replay, config):
        self.replay = replay
        self.config = config
        self.frames = []

    def add(self, ts, side, pkt):
        self.frames.append((ts, side, pkt))
        return pkt

    def run(self):
        return self.replay(self.config, list(self.frames))
