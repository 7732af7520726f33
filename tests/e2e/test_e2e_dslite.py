"""DS-Lite (RFC 6333) through a live natrix, judged by real stacks: two
homes, nx-sub1 and nx-sub2, each behind an independent user-space B4
(b4/b4.py, written from RFC 6333 and RFC 2473: a TUN device whose IPv4 goes
to the AFTR in IPv4-in-IPv6 over a raw socket, this kernel having no
ip6tnl), both using the same private address 192.0.0.2, run ping, curl and
UDP to the IPv4 servers at the same time; one home downloads through a
softwire whose MTU makes natrix fragment the outer IPv6 packets, sends a
datagram its kernel fragments after encapsulation, and is the destination
of a DF packet too big for the softwire.

natrix's AFTR address is 2001:db8:1::af, on the inside link beside its
address6 2001:db8:1::1: the B4s' kernels find it with Neighbor Discovery,
which natrix answers, and natrix finds the B4s (2001:db8:1::2 and ::3, the
lab's IPv6 addresses of the homes) the same way.
"""

import contextlib
import hashlib
import json
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import e2e_harness as h
from e2e_harness import NS_SUB1, NS_SUB2, SRV1
from test_e2e_router import HTTP_PORT, http_server  # noqa: F401 (http_server is a fixture)

h.skip_module_if_unavailable()

AFTR = "2001:db8:1::af"
HOMES = (NS_SUB1, NS_SUB2)
B4_ADDRESS = {NS_SUB1: "2001:db8:1::2", NS_SUB2: "2001:db8:1::3"}
B4_SCRIPT = Path(__file__).resolve().parent / "b4" / "b4.py"
LAB_GATEWAY = "100.64.0.1"


@contextlib.contextmanager
def b4s(homes, mtu=None):
    """A B4 in each home (its TUN's MTU `mtu`, else the B4's default); the
    homes' IPv4 default route goes into the softwire while it runs and back
    to the lab's gateway afterwards."""
    procs = []
    try:
        for ns in homes:
            argv = ["python3", str(B4_SCRIPT), "--aftr", AFTR, "--b4", B4_ADDRESS[ns]] + (["--mtu", str(mtu)] if mtu else [])
            p = subprocess.Popen(h.netns_cmd(ns, *argv),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=h.clean_env())
            procs.append(p)
            ready, _, _ = select.select([p.stdout], [], [], 10)
            line = p.stdout.readline() if ready else ""
            assert line.strip() == "ready", f"the B4 in {ns} did not start: {line!r} {p.stderr.read() if p.poll() is not None else ''}"
        yield
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for ns in homes:
            h.run_in(ns, "ip", "route", "replace", "default", "via", LAB_GATEWAY)


@contextlib.contextmanager
def server_in_srv1(script, *argv):
    """`python3 -c script argv` in nx-srv1; yields the first line it prints."""
    server = subprocess.Popen(h.netns_cmd(h.NS_SRV1, "python3", "-c", script, *map(str, argv)),
                              stdout=subprocess.PIPE, text=True, env=h.clean_env())
    try:
        ready, _, _ = select.select([server.stdout], [], [], 10)
        line = server.stdout.readline().strip() if ready else ""
        assert line, "the server in nx-srv1 did not start"
        yield line, server
    finally:
        server.kill()
        server.wait(timeout=5)


@pytest.fixture
def aftr(natrix):
    return natrix({"dslite": {"aftr": AFTR}})


@pytest.fixture
def homes(aftr):
    with b4s(HOMES):
        yield aftr


def in_home(ns, *argv, timeout=15):
    r = h.run_in(ns, *argv, timeout=timeout)
    assert r.returncode == 0, f"{ns}: `{' '.join(map(str, argv))}` failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def both(fn):
    """Runs fn(ns) in both homes at the same time; returns their results."""
    results, errors = {}, []

    def run(ns):
        try:
            results[ns] = fn(ns)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(ns,)) for ns in HOMES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [results[ns] for ns in HOMES]


def test_ping_from_two_homes_with_one_private_address(homes):
    for out in both(lambda ns: in_home(ns, "ping", "-c", "3", "-i", "0.3", "-W", "2", "-I", "192.0.0.2", SRV1)):
        assert " 0% packet loss" in out, out


def test_curl_from_two_homes_reaches_the_server_from_pool_addresses(homes, http_server):  # noqa: F811
    url = f"http://{SRV1}:{HTTP_PORT}/"
    peers = both(lambda ns: json.loads(in_home(ns, "curl", "-4", "-sS", "--noproxy", "*", "--max-time", "5", url))["peer"])
    for peer in peers:
        assert h.in_pool(peer, homes.pool), f"the server saw {peer}, not a pool address of {homes.pool}"


def test_curl_from_two_homes_through_af_packet(natrix, http_server):  # noqa: F811
    """AF_PACKET's copies leave room before each frame, where a reply to a
    home gets its outer headers: the same downloads as over AF_XDP."""
    aftr = natrix({"dslite": {"aftr": AFTR}, "io": "af_packet"})
    url = f"http://{SRV1}:{HTTP_PORT}/"
    with b4s(HOMES):
        peers = both(lambda ns: json.loads(in_home(ns, "curl", "-4", "-sS", "--noproxy", "*", "--max-time", "5", url))["peer"])
    for peer in peers:
        assert h.in_pool(peer, aftr.pool), f"the server saw {peer}, not a pool address of {aftr.pool}"


UDP_ECHO = """
import socket, sys, threading
srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
srv.bind((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
while True:
    data, peer = srv.recvfrom(2048)
    srv.sendto(data + b" from " + peer[0].encode() + b":" + str(peer[1]).encode(), peer)
"""

UDP_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("192.0.0.2", 5000))
s.settimeout(3)
s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
print(s.recvfrom(2048)[0].decode())
"""


def test_udp_from_two_homes_with_one_endpoint_gets_two_mappings(homes):
    """Both homes send from 192.0.0.2:5000: the server sees two external
    endpoints, and each answer reaches the home that asked."""
    server = subprocess.Popen(h.netns_cmd(h.NS_SRV1, "python3", "-c", UDP_ECHO, SRV1), stdout=subprocess.PIPE, text=True, env=h.clean_env())
    try:
        ready, _, _ = select.select([server.stdout], [], [], 10)
        port = server.stdout.readline().strip() if ready else ""
        assert port.isdigit(), "the UDP echo server did not start"
        answers = both(lambda ns: in_home(ns, "python3", "-c", UDP_CLIENT, SRV1, port, ns).strip())
    finally:
        server.kill()
        server.wait(timeout=5)
    seen = []
    for ns, answer in zip(HOMES, answers):
        tag, _, endpoint = answer.partition(" from ")
        assert tag == ns, f"{ns} got another home's answer: {answer!r}"
        addr, port = endpoint.rsplit(":", 1)
        assert h.in_pool(addr, homes.pool), answer
        seen.append((addr, port))
    assert seen[0] != seen[1], f"two homes shared one external endpoint: {seen}"


def test_metrics_count_the_softwires(homes):
    both(lambda ns: in_home(ns, "ping", "-c", "1", "-W", "2", "-I", "192.0.0.2", SRV1))
    r = h.run_in(h.NS_NAT, "curl", "-sS", "--noproxy", "*", "-m", "5", f"http://{h.DEFAULT_API}/metrics")
    assert r.returncode == 0, r.stderr
    values = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("natrix_dslite_")}
    assert values.get("natrix_dslite_softwires") == 2, values
    assert values.get("natrix_dslite_decapsulated_packets_total", 0) >= 2, values
    assert values.get("natrix_dslite_encapsulated_packets_total", 0) >= 2, values


def test_show_filters_by_b4_and_names_the_inner_address(homes):
    both(lambda ns: in_home(ns, "ping", "-c", "1", "-W", "2", "-I", "192.0.0.2", SRV1))
    r = h.run_in(h.NS_NAT, str(h.natrix_bin()), "show", "mappings", "--b4", "2001:db8:1::2", "--json", "--api", h.DEFAULT_API)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and all((m["b4"], m["subscriber"]) == ("2001:db8:1::2", "192.0.0.2") for m in rows), rows
    assert all(h.in_pool(m["outside"].rsplit(":", 1)[0], homes.pool) for m in rows), rows


def test_show_gives_one_b4s_own_counters(homes):
    """Per-B4 counters: a ping's request decapsulated and its reply
    encapsulated are counted on that B4 (three echoes the kernel's ping saw
    answered), and `natrix show --b4` prints them."""
    before = {}
    for b4 in ("2001:db8:1::2", "2001:db8:2::2"):
        r = h.run_in(h.NS_NAT, str(h.natrix_bin()), "show", "sessions", "--b4", b4, "--json", "--api", h.DEFAULT_API)
        rows = json.loads(r.stdout) if r.returncode == 0 else []
        before[b4] = rows[0]["softwire"] if rows else {"decapsulated": 0, "encapsulated": 0}
    # in_home fails the test unless every ping is answered.
    in_home(HOMES[0], "ping", "-c", "3", "-i", "0.2", "-W", "2", "-I", "192.0.0.2", SRV1)
    r = h.run_in(h.NS_NAT, str(h.natrix_bin()), "show", "sessions", "--b4", "2001:db8:1::2", "--json", "--api", h.DEFAULT_API)
    rows = json.loads(r.stdout)
    w = rows[0]["softwire"]
    assert w["decapsulated"] - before["2001:db8:1::2"]["decapsulated"] >= 3 and w["encapsulated"] - before["2001:db8:1::2"]["encapsulated"] >= 3, (before, w)
    assert w["sessions"] >= 1 and all(x["softwire"] == w for x in rows), rows
    text = h.run_in(h.NS_NAT, str(h.natrix_bin()), "show", "sessions", "--b4", "2001:db8:1::2", "--api", h.DEFAULT_API).stdout
    assert f"B4 2001:db8:1::2: {w['sessions']} sessions;" in text, text


# The softwire's MTU for the fragmentation test: IPv6's minimum (RFC 8200),
# below the 1500 bytes of the server's full-size segments plus 40.
SMALL_MTU = 1280
DOWNLOAD_BYTES = 512 * 1024

# An HTTP/1.0 server for nx-srv1 sending DOWNLOAD_BYTES random bytes, with
# DF clear on its packets (IP_PMTUDISC_DONT): the AFTR then fragments the
# outer IPv6 packets towards the home (RFC 2473 section 7.2) rather than
# asking the server for a smaller MTU. Prints its port and the body's SHA-256.
DOWNLOAD_SERVER = r"""
import hashlib, os, socket, sys
IP_MTU_DISCOVER, IP_PMTUDISC_DONT = 10, 0
body = os.urandom(int(sys.argv[2]))
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], hashlib.sha256(body).hexdigest(), flush=True)
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DONT)
    conn.settimeout(10)
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(4096)
        if not chunk:
            break
        request += chunk
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    conn.close()
"""


def reassembled_ok(ns):
    """The namespace's count of IPv6 packets its kernel reassembled (RFC 8200)."""
    for line in h.run_in(ns, "cat", "/proc/net/snmp6").stdout.splitlines():
        name, value = line.split()
        if name == "Ip6ReasmOKs":
            return int(value)
    raise AssertionError(f"no Ip6ReasmOKs in {ns}'s /proc/net/snmp6")


@pytest.fixture
def download_server():
    with server_in_srv1(DOWNLOAD_SERVER, SRV1, DOWNLOAD_BYTES) as (line, _):
        port, sha = line.split()
        yield int(port), sha


def test_a_download_through_a_small_softwire_mtu_arrives_whole_in_outer_fragments(natrix, download_server, tmp_path):
    """`[dslite] mtu` below the server's packets plus 40 (MSS clamping off,
    so TCP does not avoid it): natrix must fragment the outer IPv6 packets
    towards the home, never the inner IPv4 (RFC 6333 sections 5.3 and 6.3,
    RFC 2473 section 7.2). The home's kernel reassembles them before the B4
    decapsulates; tshark on the home's link sees the fragments and that none
    exceeds the MTU; curl's download has the server's SHA-256."""
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed here (apt-get install -y tshark)")
    port, sha = download_server
    natrix({"dslite": {"aftr": AFTR, "mtu": SMALL_MTU, "mss_clamp": "off"}})
    with b4s((NS_SUB1,)):
        cap = h.Tshark(NS_SUB1, "eth0", f"ip6 src host {AFTR}", tmp_path / "home.pcapng")
        before = reassembled_ok(NS_SUB1)
        out = tmp_path / "download"
        in_home(NS_SUB1, "curl", "-4", "-sS", "--noproxy", "*", "--max-time", "20", "-o", str(out),
                f"http://{SRV1}:{port}/", timeout=30)
        reassembled = reassembled_ok(NS_SUB1) - before
        frames = cap.fields("ipv6", "ipv6.plen", "ipv6.fraghdr.nxt", "ipv6.fraghdr.offset", occurrence="f")
    assert hashlib.sha256(out.read_bytes()).hexdigest() == sha, f"the download ({out.stat().st_size} bytes) differs from what the server sent"
    assert frames, "tshark saw no packet from the AFTR on the home's link"
    too_big = [f for f in frames if 40 + int(f[0]) > SMALL_MTU]
    assert not too_big, f"{len(too_big)} packets from the AFTR exceed the softwire MTU {SMALL_MTU}: payload lengths {sorted({f[0] for f in too_big})}"
    fragments = [f for f in frames if f[1]]
    assert fragments and all(f[1] == "4" for f in fragments), f"outer fragments of IPv4-in-IPv6 expected: {fragments[:5]}"
    firsts = sum(1 for f in fragments if f[2] == "0")
    assert reassembled >= firsts, f"the home's kernel reassembled {reassembled} packets, natrix fragmented {firsts}"


# A UDP server for nx-srv1 answering each datagram with its length and SHA-256.
UDP_DIGEST_SERVER = r"""
import hashlib, socket, sys
srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
srv.bind((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
while True:
    data, peer = srv.recvfrom(65535)
    srv.sendto(b"%d %s" % (len(data), hashlib.sha256(data).hexdigest().encode()), peer)
"""

# Sends SIZE random bytes to the digest server (again if no answer: the first
# may wait for neighbour discovery); prints the answer, then its own digest.
UDP_DIGEST_CLIENT = r"""
import hashlib, os, socket, sys
data = os.urandom(int(sys.argv[3]))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
answer = "none none"
for _ in range(3):
    s.sendto(data, (sys.argv[1], int(sys.argv[2])))
    try:
        answer = s.recv(200).decode()
        break
    except socket.timeout:
        pass
print(answer, len(data), hashlib.sha256(data).hexdigest())
"""


def test_a_datagram_the_b4_fragmented_is_reassembled_by_natrix(natrix, tmp_path):
    """The B4's TUN MTU at 1500, as the link's: a 1500-byte IPv4 packet
    leaves the home as a 1540-byte IPv6 packet, which the home's kernel
    fragments after encapsulation (RFC 6333 section 5.3); natrix must
    reassemble before decapsulating (section 6.3): the server gets the whole
    datagram (its length and SHA-256 come back), and tshark on the home's
    link saw the outer fragments."""
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed here (apt-get install -y tshark)")
    natrix({"dslite": {"aftr": AFTR}})
    size = 1500 - 20 - 8
    with server_in_srv1(UDP_DIGEST_SERVER, SRV1) as (port, _), b4s((NS_SUB1,), mtu=1500):
        cap = h.Tshark(NS_SUB1, "eth0", f"ip6 src host {B4_ADDRESS[NS_SUB1]} and dst host {AFTR}", tmp_path / "home.pcapng")
        got_size, got_sha, sent_size, sent_sha = in_home(NS_SUB1, "python3", "-c", UDP_DIGEST_CLIENT, SRV1, port, size).split()
        frames = cap.fields("ipv6.fraghdr", "ipv6.fraghdr.nxt", "ipv6.fraghdr.offset", occurrence="f")
    assert (got_size, got_sha) == (sent_size, sent_sha), f"the server got {got_size} bytes ({got_sha}), the home sent {sent_size} ({sent_sha})"
    assert len(frames) >= 2 and all(f[0] == "4" for f in frames), f"the home's kernel should have fragmented the outer packet: {frames}"


# A UDP server for nx-srv1 with path MTU discovery on (DF set): it answers
# the first datagram with a DATAGRAM_SIZE-byte one, waits, and prints the
# path MTU its kernel now holds for the client (IP_MTU), which only an ICMP
# fragmentation needed matching its socket can have lowered.
DF_SERVER = r"""
import socket, sys, time
IP_MTU_DISCOVER, IP_PMTUDISC_DO, IP_MTU = 10, 2, 14
srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
srv.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
srv.bind((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
_, peer = srv.recvfrom(2048)
srv.connect(peer)
srv.send(b"x" * int(sys.argv[2]))
time.sleep(1)
print(srv.getsockopt(socket.IPPROTO_IP, IP_MTU), flush=True)
"""

UDP_HELLO = """
import socket, sys
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"hello", (sys.argv[1], int(sys.argv[2])))
"""


def test_a_df_packet_too_big_for_the_softwire_gets_fragmentation_needed_with_mtu_minus_40(natrix):
    """RFC 2473 section 7.2 and CONTRACTS `[dslite] mtu`: an IPv4 packet
    towards a B4 with DF set that would not fit the softwire is not
    fragmented but answered with ICMPv4 fragmentation needed giving `mtu` -
    40; the server's kernel takes it (it must quote the packet as the server
    sent it) and lowers its path MTU to the home's external address."""
    natrix({"dslite": {"aftr": AFTR, "mtu": SMALL_MTU}})
    with server_in_srv1(DF_SERVER, SRV1, 1400) as (port, server), b4s((NS_SUB1,)):
        in_home(NS_SUB1, "python3", "-c", UDP_HELLO, SRV1, port)
        ready, _, _ = select.select([server.stdout], [], [], 10)
        mtu = server.stdout.readline().strip() if ready else "no answer"
    assert mtu == str(SMALL_MTU - 40), f"the server's path MTU towards the home: {mtu}"


# IPv4-in-IPv6 (an ICMP echo request to the home's 192.0.0.2) to nx-sub1's
# B4, from the IPv6 source given, sent by scapy in nx-sub2.
SOFTWIRE_FROM = r"""
import sys
from scapy.all import ICMP, IP, IPv6, conf, send
conf.verb = 0
send(IPv6(src=sys.argv[1], dst=sys.argv[2], nh=4) / IP(src="198.51.100.11", dst="192.0.0.2") / ICMP(id=7, seq=1))
"""


def tun_received(ns):
    """Packets the B4 wrote to its TUN in namespace `ns` (the TUN's rx)."""
    link = json.loads(in_home(ns, "ip", "-s", "-j", "link", "show", "b4"))[0]
    return link["stats64"]["rx"]["packets"]


def test_the_b4_takes_softwire_packets_from_the_aftr_only(lab):
    """The lab's B4 itself (RFC 6333 section 5: the softwire's far end is
    the AFTR): IPv4-in-IPv6 to it from another address never reaches the
    home; the same packet from the AFTR's address does."""
    with b4s((NS_SUB1,)):
        before = tun_received(NS_SUB1)
        in_home(NS_SUB2, "python3", "-c", SOFTWIRE_FROM, B4_ADDRESS[NS_SUB2], B4_ADDRESS[NS_SUB1])
        time.sleep(h.QUIET)
        assert tun_received(NS_SUB1) == before, "a softwire packet from another B4 reached the home"
        in_home(NS_SUB2, "python3", "-c", SOFTWIRE_FROM, AFTR, B4_ADDRESS[NS_SUB1])
        time.sleep(0.5)
        assert tun_received(NS_SUB1) == before + 1, "the packet from the AFTR's address did not reach the home"
