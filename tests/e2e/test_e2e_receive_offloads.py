"""What offloads do to the frames natrix receives.

A Linux sender whose interface has checksum offload (a veth's default)
writes only the pseudo-header's sum into a TCP or UDP checksum field and
leaves the rest to the NIC. On a veth no NIC ever finishes it: the peer's
kernel is told so and trusts the frame. natrix reads bytes. AF_PACKET
tells it (TP_STATUS_CSUMNOTREADY), AF_XDP does not, and either way natrix
must finish such a checksum before it rewrites the frame, or no receiver
accepts what it sends on. And a packet socket gets what GRO merged on
natrix's own interface (a NIC's default) as one frame, too long to
forward.

The lab turns every offload off. Here checksum offload is turned on for
the client's and the server's veths and for the switch's ports towards
natrix (with it off there, the bridge would finish the sum itself), or
GRO on natrix's inside, and off again after. Judged by:

- the kernels' sockets: a TCP echo of 1 MiB comes back intact both ways (a
  receiving kernel drops a segment whose checksum does not verify), as
  do two of 256 KiB over IPv6, which natrix routes, one with a
  Destination Options header on the client's segments, and every UDP
  datagram is echoed, also through a DS-Lite softwire whose inner
  checksums a B4 left partial;
- tshark where the frames arrive (nx-srv1's eth0 for what natrix sends
  out, nx-sub1's for what it sends in): every TCP and UDP checksum
  verifies; and where they were sent, that the senders' frames did leave
  with checksums that do not, many of them (the case under test happened);
- natrix's `rx_checksums_completed` counters;
- `ethtool -k`: GRO off on natrix's inside while natrix runs on AF_PACKET,
  on again after.

The checksum test runs in every arrangement of the suite: AF_XDP native
and generic, and AF_PACKET. Then, with generic XDP programs, what a veth
peer's segmentation offload sends them. Needs tshark and ethtool. About
20 s.
"""

import json
import shutil
import subprocess
import sys

import pytest

import e2e_harness as h
from e2e_harness import NS_NAT, NS_SRV1, NS_SUB1, SRV1, SUB1

SUB1_6, SRV1_6 = "2001:db8:1::2", "2001:db8:2::11"  # the lab's, routed by natrix

h.skip_module_if_unavailable()

needs_tools = pytest.mark.skipif(shutil.which("tshark") is None or shutil.which("ethtool") is None,
                                 reason="needs tshark and ethtool (apt-get install -y tshark ethtool)")

PORT = 7301
# The senders' veths, and the switch's ports their frames reach natrix by.
OFFLOADING = ((NS_SUB1, "eth0"), (NS_SRV1, "eth0"), ("nx-sw", "nx-nat-in"), ("nx-sw", "nx-nat-out"))

# Echo server (nx-srv1): TCP over IPv4 and IPv6, each connection's bytes
# echoed until EOF; UDP, each datagram echoed. Prints {"listening": port}
# once all listen.
SERVER = r"""
import json, socket, sys, threading
port = int(sys.argv[1])
def listener(family, addr):
    t = socket.socket(family); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        t.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    t.bind((addr, port)); t.listen(4)
    return t
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", port))
def tcp(t):
    while True:
        c, _ = t.accept()
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
        c.close()
def udp():
    while True:
        d, peer = u.recvfrom(65536)
        u.sendto(d, peer)
for t in (listener(socket.AF_INET, "0.0.0.0"), listener(socket.AF_INET6, "::")):
    threading.Thread(target=tcp, args=(t,), daemon=True).start()
threading.Thread(target=udp, daemon=True).start()
print(json.dumps({"listening": port}), flush=True)
threading.Event().wait()
"""

# Client (nx-sub1): 1 MiB of random bytes over TCP, read back; then 50 UDP
# datagrams, each waited for; then, with a third argument (the server's
# IPv6 address), 256 KiB over TCP on IPv6, which natrix routes, once
# plainly and once with a Destination Options header (PadN) on every
# segment the client sends. Prints {"tcp_intact", "udp_answered"[,
# "tcp6_intact", "tcp6_options_intact"]}.
CLIENT = r"""
import json, os, socket, sys, threading
server, port = sys.argv[1], int(sys.argv[2])
def connected(server, dstopts):
    if dstopts is None:
        return socket.create_connection((server, port), timeout=20)
    s = socket.socket(socket.AF_INET6)
    s.settimeout(20)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_DSTOPTS, dstopts)
    s.connect((server, port))
    return s
def echoed(server, size, dstopts=None):
    payload = os.urandom(size)
    s = connected(server, dstopts)
    threading.Thread(target=s.sendall, args=(payload,), daemon=True).start()
    got = bytearray()
    while len(got) < len(payload):
        d = s.recv(65536)
        if not d:
            break
        got += d
    s.close()
    return bytes(got) == payload
result = {"tcp_intact": echoed(server, 1 << 20)}
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2); u.connect((server, port))
answered = 0
for i in range(50):
    msg = f"partial-{i:03d}-".ljust(300, "x").encode()
    u.send(msg)
    try:
        answered += u.recv(65536) == msg
    except socket.timeout:
        pass
result["udp_answered"] = answered
if len(sys.argv) > 3:
    result["tcp6_intact"] = echoed(sys.argv[3], 1 << 18)
    # Next header (the kernel's), length 0 (8 bytes), PadN of 4.
    result["tcp6_options_intact"] = echoed(sys.argv[3], 1 << 18, bytes([0, 0, 1, 4, 0, 0, 0, 0]))
print(json.dumps(result), flush=True)
"""


def ethtool_tx(state):
    for ns, dev in OFFLOADING:
        h.sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", state, check=False)


def tx_checksumming(ns, dev):
    out = h.sh("ip", "netns", "exec", ns, "ethtool", "-k", dev, check=False).stdout
    return next((line.split(":")[1].split()[0] for line in out.splitlines() if line.startswith("tx-checksumming:")), "?")


def decode(path, display_filter, *fields):
    """tshark's decoding of a capture, checksums verified."""
    out = subprocess.run(["tshark", "-r", str(path), "-o", "tcp.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
                          "-Y", display_filter, "-T", "fields", "-E", "occurrence=f", *[a for f in fields for a in ("-e", f)]],
                         capture_output=True, text=True, timeout=60, env=h.clean_env())
    assert out.returncode == 0, f"tshark -r {path}: {out.stderr}"
    return [line.split("\t") for line in out.stdout.splitlines()]


def interfaces():
    r = h.run_in(NS_NAT, "curl", "-sS", "-f", "--noproxy", "*", "-m", "5", f"http://{h.DEFAULT_API}/api/stats", timeout=10)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["interfaces"]


def completed():
    return {side: counters["rx_checksums_completed"] for side, counters in interfaces().items()}


def status_by_direction(path, senders):
    """{"sent": statuses of the frames `senders` (its IPv4 and IPv6
    addresses) sent, "received": the others'}, tshark's checksum status of
    each TCP segment and UDP datagram."""
    rows = decode(path, f"tcp.port == {PORT}", "ip.src", "ipv6.src", "tcp.checksum.status")
    rows += decode(path, f"udp.port == {PORT}", "ip.src", "ipv6.src", "udp.checksum.status")
    got = {"sent": [], "received": []}
    for src4, src6, status in rows:
        if status:
            got["sent" if (src4 or src6) in senders else "received"].append(status)
    return got


def echo_server():
    srv = subprocess.Popen(h.netns_cmd(NS_SRV1, sys.executable, "-u", "-c", SERVER, str(PORT)), stdout=subprocess.PIPE, text=True, env=h.clean_env())
    assert json.loads(srv.stdout.readline()) == {"listening": PORT}
    return srv


def gro_shown(ns, dev):
    out = h.sh("ip", "netns", "exec", ns, "ethtool", "-k", dev, check=False).stdout
    return next((line.split(":")[1].split()[0] for line in out.splitlines() if line.startswith("generic-receive-offload:")), "?")


@needs_tools
def test_af_packet_turns_gro_off_while_it_runs(natrix):
    """With GRO on natrix's inside, as a NIC has it by default, natrix on
    AF_PACKET says it turns GRO off while it runs, a 1 MiB TCP echo comes
    back intact, nothing is refused, and GRO is on again once natrix has
    stopped."""
    h.sh("ip", "netns", "exec", NS_NAT, "ethtool", "-K", "inside", "gro", "on")
    srv = n = None
    try:
        assert gro_shown(NS_NAT, "inside") == "on"
        n = natrix({"io": "af_packet"})
        note = "inside: GRO off while natrix runs"
        assert note in n.err.text(), f"natrix should say {note!r}:\n{n.output()}"
        assert gro_shown(NS_NAT, "inside") == "off"
        srv = echo_server()
        out = h.run_in(NS_SUB1, sys.executable, "-c", CLIENT, SRV1, str(PORT), timeout=60, check=False)
        assert out.returncode == 0, f"client failed: {out.stderr}\n{n.output()}"
        assert json.loads(out.stdout) == {"tcp_intact": True, "udp_answered": 50}, n.output()
        assert interfaces()["inside"]["rx_refused"] == 0
        rc = n.stop()
        n.reported = True  # stopped here: the fixture has nothing to stop or report
        assert rc == 0, n.output()
        assert gro_shown(NS_NAT, "inside") == "on", "natrix should put GRO back on at stop"
    finally:
        # natrix first, or stopping it would put GRO back on after this.
        if n is not None and not getattr(n, "reported", False):
            n.stop()
            n.reported = True
        h.sh("ip", "netns", "exec", NS_NAT, "ethtool", "-K", "inside", "gro", "off", check=False)
        if srv:
            srv.kill()
            srv.wait(timeout=5)


@needs_tools
def test_partial_checksums_are_finished_before_translation(natrix, tmp_path):
    n = natrix()
    srv = echo_server()
    caps = {}
    try:
        ethtool_tx("on")
        assert all(tx_checksumming(ns, dev) == "on" for ns, dev in OFFLOADING), "ethtool did not turn checksum offload on"
        before = completed()
        for ns in (NS_SUB1, NS_SRV1):
            # libpcap's `port` does not look past an extension header.
            caps[ns] = h.Tshark(ns, "eth0", f"port {PORT} or ip6 proto 60", tmp_path / f"{ns}.pcapng")
        out = h.run_in(NS_SUB1, sys.executable, "-c", CLIENT, SRV1, str(PORT), SRV1_6, timeout=60, check=False)
        for c in caps.values():
            c.stop()
    finally:
        ethtool_tx("off")
        srv.kill()
        srv.wait(timeout=5)
        for c in caps.values():
            c.stop()
    assert out.returncode == 0, f"client failed: {out.stderr}\n{n.output()}"
    result = json.loads(out.stdout)
    assert result == {"tcp_intact": True, "udp_answered": 50, "tcp6_intact": True, "tcp6_options_intact": True}, (
        f"through natrix with the senders' checksum offload on: {result}\n{n.output()}")

    grown = {side: completed()[side] - before[side] for side in before}
    assert grown["inside"] > 0 and grown["outside"] > 0, f"natrix finished no partial checksum on some side: {grown}"
    # tshark: 1 good, 0 bad.
    for ns, sender in ((NS_SUB1, (SUB1, SUB1_6)), (NS_SRV1, (SRV1, SRV1_6))):
        seen = status_by_direction(caps[ns].path, sender)
        # The sender's kernel computes some checksums itself all the same.
        partial = seen["sent"].count("0")
        assert partial >= 10, (
            f"{sender}'s own frames, captured as sent, should mostly carry partial checksums tshark finds bad: "
            f"{partial} of {len(seen['sent'])}")
        assert seen["received"] and set(seen["received"]) == {"1"}, (
            f"frames natrix sent to {ns}: every TCP and UDP checksum should verify, tshark found {sorted(set(seen['received']))}")
    # The segments behind a Destination Options header left partial too,
    # and arrived whole.
    options = "ipv6.dstopts and tcp.len > 0"
    sent = [status for _, status in decode(caps[NS_SUB1].path, options, "ipv6.src", "tcp.checksum.status")]
    arrived = [status for _, status in decode(caps[NS_SRV1].path, options, "ipv6.src", "tcp.checksum.status")]
    assert sent.count("0") >= 10, f"the client's segments behind options should mostly leave partial: {sent.count('0')} of {len(sent)}"
    assert arrived and set(arrived) == {"1"}, f"segments behind options natrix sent on: tshark found {sorted(set(arrived))}"


NO_AF_XDP = h.af_xdp_unavailable()

AFTR = "2001:db8:1::af"
B4_INNER = "192.0.0.2"  # RFC 6333's B4 address

# B4 (nx-sub1, no ip6tnl in this kernel): 20 UDP datagrams to the server in
# IPv4-in-IPv6 to the AFTR over a raw socket, each as a B4's kernel sends
# it over a veth with checksum offload on (so the kernel source says; not
# seen here): the inner UDP checksum holds only the pseudo-header's sum,
# worked out here. Every other one with ip6tnl's encapsulation limit.
# Waits for the echoes in the softwire. Prints {"answered": echoes whose
# payload and UDP checksum are right}.
SOFTWIRE_CLIENT = r"""
import json, socket, struct, sys
aftr, b4_6, b4, server, port = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
SPORT = 40007
def fold(s):
    while s > 0xffff:
        s = (s & 0xffff) + (s >> 16)
    return s
def words(b):
    b = b + b"\0" * (len(b) % 2)
    return sum(struct.unpack(f"!{len(b) // 2}H", b))
def pseudo(src, dst, length):
    return fold(words(socket.inet_aton(src) + socket.inet_aton(dst)) + 17 + length)
def datagram(payload):
    length = 8 + len(payload)
    udp = struct.pack("!HHHH", SPORT, port, length, pseudo(b4, server, length)) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + length, 1, 0, 64, 17, 0, socket.inet_aton(b4), socket.inet_aton(server))
    ip = ip[:10] + struct.pack("!H", 0xffff - fold(words(ip))) + ip[12:]
    return ip + udp
def answer_ok(packet, payload):
    ihl = (packet[0] & 0x0f) * 4
    if packet[9] != 17 or socket.inet_ntoa(packet[12:16]) != server:
        return False
    udp = packet[ihl:]
    length = struct.unpack("!H", udp[4:6])[0]
    whole = fold(pseudo(server, b4, length) + words(udp[:length]))
    return struct.unpack("!H", udp[2:4])[0] == SPORT and udp[8:length] == payload and whole == 0xffff
def b4_socket(dstopts=None):
    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, 4)
    s.bind((b4_6, 0))
    s.settimeout(2)
    if dstopts:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_DSTOPTS, dstopts)
    return s
# Every other datagram as ip6tnl sends them by default: behind a
# Destination Options header with a Tunnel Encapsulation Limit of 4
# (RFC 2473), padded by PadN.
plain, limited = b4_socket(), b4_socket(bytes([0, 0, 4, 1, 4, 1, 1, 0]))
answered = 0
for i in range(20):
    s = limited if i % 2 else plain
    payload = f"softwire-{i:03d}-".ljust(200, "y").encode()
    s.sendto(datagram(payload), (aftr, 0))
    try:
        while True:
            if answer_ok(s.recv(65536), payload):
                answered += 1
                break
    except socket.timeout:
        pass
print(json.dumps({"answered": answered}), flush=True)
"""


@pytest.mark.skipif(NO_AF_XDP is not None, reason=f"needs AF_XDP: {NO_AF_XDP}")
def test_a_softwires_partial_inner_checksum_is_finished(natrix):
    """A B4 whose veth has checksum offload on sends its inner UDP
    checksum partial inside the softwire. AF_XDP does not say so; natrix
    finds it within the IPv6 packet and finishes it before it
    decapsulates and translates, or the server's kernel would drop every
    datagram. (AF_PACKET marks such a frame, and its kernel sender needs
    an ip6tnl this kernel lacks, so this runs on AF_XDP.)"""
    n = natrix({"io": "af_xdp", "dslite": {"aftr": AFTR}})
    srv = echo_server()
    try:
        before = completed()
        out = h.run_in(NS_SUB1, sys.executable, "-c", SOFTWIRE_CLIENT, AFTR, SUB1_6, B4_INNER, SRV1, str(PORT),
                       timeout=90, check=False)
        after = completed()
    finally:
        srv.kill()
        srv.wait(timeout=5)
    assert out.returncode == 0, f"the B4 failed: {out.stderr}\n{n.output()}"
    assert json.loads(out.stdout) == {"answered": 20}, f"echoes through the softwire: {out.stdout}\n{n.output()}"
    assert after["inside"] - before["inside"] >= 20, f"natrix should count the inner checksums it finished: {before} -> {after}"

# Client (nx-sub1): 256 KiB over TCP, giving up after 3 s. Prints {"sent"}.
BULK_CLIENT = r"""
import json, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
sent = 0
try:
    while sent < 1 << 18:
        sent += s.send(bytes(65536))
except OSError:
    pass
print(json.dumps({"sent": sent}), flush=True)
"""


@needs_tools
@pytest.mark.skipif(NO_AF_XDP is not None, reason=f"needs AF_XDP: {NO_AF_XDP}")
def test_generic_programs_count_a_veth_peers_unsegmented_segments(natrix):
    """With generic programs a veth peer's TSO segments reach natrix whole,
    longer than its buffers: natrix says so at start, and drops and counts
    them (`rx_refused`) rather than as overruns of its ring."""
    n = natrix({"io": "af_xdp", "xdp_mode": "generic"})
    note = "inside is a veth: generic XDP programs see its peer's TCP segments unsegmented"
    assert note in n.err.text(), f"natrix should say: {note!r}\n{n.output()}"
    srv = echo_server()
    client_side = ((NS_SUB1, "eth0"), ("nx-sw", "nx-nat-in"))
    try:
        for ns, dev in client_side:
            h.sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "on", "tso", "on", "gso", "on", check=False)
        before = interfaces()
        h.run_in(NS_SUB1, sys.executable, "-c", BULK_CLIENT, SRV1, str(PORT), timeout=30, check=False)
        after = interfaces()
    finally:
        for ns, dev in client_side:
            h.sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", check=False)
        srv.kill()
        srv.wait(timeout=5)
    grown = {k: after["inside"][k] - before["inside"][k] for k in ("rx_refused", "rx_kernel_dropped")}
    assert grown["rx_refused"] > 0, f"no segment longer than natrix's buffers counted on inside: {grown}\n{n.output()}"
    assert grown["rx_kernel_dropped"] == 0, f"segments too long for natrix's buffers counted as ring overruns: {grown}"
