"""The XDP offload of established flows (top-level `offload`, default
"auto"): once natrix's engine has translated a few frames of a steady flow
direction (UDP with a session, TCP established without FIN or RST), the
interface's XDP program rewrites and redirects that direction's frames
itself; FIN/RST, `POST /api/clear`, SIGHUP and idleness hand flows back to
the engine; frames it must not take (shorter than 54 bytes, TTL <= 1, ...)
stay with the engine.

Judged by parts that are not natrix:

- the kernels' sockets: a 5 MiB TCP echo through natrix arrives whole both
  ways (SHA-256 of every byte at both ends; the receiving kernels drop any
  segment whose IP or TCP checksum is wrong, so intact data is their
  verdict on the incremental checksums), the server's socket sees a pool
  address, a UDP echo flow gets every answer with its own payload from one
  constant external endpoint;
- tshark on nx-sub1's and nx-srv1's eth0: the TTL each offloaded frame
  arrives with is the sender's TTL (as captured where it was sent) less
  one, IPv4, TCP and UDP checksums verify, a UDP checksum of 0 (the
  sender's SO_NO_CHECK) arrives as 0;
- the kernels' veth counters: the frames the client and the server sent,
  against natrix's `offloaded` counters (most of a bulk transfer's frames
  must be forwarded by XDP);
- `ethtool` in nx-sw: with GRO off on the peers of natrix's interfaces no
  veth takes XDP redirects, and natrix must say so (`"auto"`) or refuse
  (`true`).

natrix's own `/api/stats` `offloaded`, `/api/sessions` `idle_s` and the
`natrix_offload*` metrics are what is under test where they are read.
Every test that needs the offload sets `io = "af_xdp"` itself (the lab's
"auto" picks it anyway), so a NATRIX_E2E_IO=af_packet pass still tests it;
`test_af_packet_has_no_offload` covers AF_PACKET. Needs AF_XDP, tshark
(Debian `tshark`) and ethtool; a test missing one is skipped naming it.
About 35 s, 20 s of it a UDP flow of 6 s and the 10 s its flows take to
go idle.
"""

import json
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import e2e_harness as h
from e2e_harness import NS_NAT, NS_SRV1, NS_SUB1, SRV1, SUB1

h.skip_module_if_unavailable()

NO_AF_XDP = h.af_xdp_unavailable()
needs_xdp = pytest.mark.skipif(NO_AF_XDP is not None, reason=f"the offload needs AF_XDP: {NO_AF_XDP}")
needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None, reason="needs tshark (apt-get install -y tshark)")
needs_ethtool = pytest.mark.skipif(shutil.which("ethtool") is None, reason="needs ethtool (apt-get install -y ethtool)")

XDP = {"io": "af_xdp"}
# What a native program's redirects need of the egress, which generic ones do not.
NATIVE = {**XDP, "xdp_mode": "native"}
TCP_PORT = 7201  # the TCP echo below; the `servers` fixture holds 7000, 7001, 7100
SWITCH = "nx-sw"
PEERS = ("nx-nat-in", "nx-nat-out")  # nx-sw's ends of natrix's inside and outside
FORWARDED = re.compile(r"offload: established flows from (inside|outside) to (inside|outside) "
                       r"are forwarded by XDP, up to (\d+) flow directions")

# TCP echo server (nx-srv1): per connection, messages of an 8-byte length
# then that many bytes, each echoed as it arrives; a zero length makes the
# server close first (its FIN), then it reads to the client's FIN and
# prints {"peer", "bytes", "sha256", "status"} for the connection.
TCP_SERVER = r"""
import hashlib, json, socket, struct, sys, threading
def exact(c, n):
    buf = b""
    while len(buf) < n:
        d = c.recv(n - len(buf))
        if not d:
            return None
        buf += d
    return buf
def serve(conn, peer):
    digest, total, status = hashlib.sha256(), 0, "closed"
    try:
        while True:
            hdr = exact(conn, 8)
            if hdr is None:
                status = "EOF before the closing message"
                break
            left = struct.unpack("!Q", hdr)[0]
            if left == 0:
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(65536):
                    pass
                break
            while left:
                d = conn.recv(min(65536, left))
                if not d:
                    raise EOFError("EOF inside a message")
                digest.update(d)
                total += len(d)
                left -= len(d)
                conn.sendall(d)
    except (OSError, EOFError) as e:
        status = repr(e)
    conn.close()
    print(json.dumps({"peer": list(peer), "bytes": total, "sha256": digest.hexdigest(), "status": status}), flush=True)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
print(json.dumps({"listening": int(sys.argv[1])}), flush=True)
while True:
    conn, peer = s.accept()
    threading.Thread(target=serve, args=(conn, peer), daemon=True).start()
"""

# TCP client (nx-sub1): connects (from BIND_PORT if not 0), prints its local
# endpoint, then per stdin line: "send N" sends N random bytes as one
# message and reads the echo, printing whether it came back intact;
# "close" asks the server to close, reads to its FIN, closes, and prints
# the SHA-256 of everything it sent; "reset" closes with an RST (SO_LINGER 0).
TCP_CLIENT = r"""
import hashlib, json, os, socket, struct, sys, threading, time
server, port, bind_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if bind_port:
    s.bind(("0.0.0.0", bind_port))
s.settimeout(30)
s.connect((server, port))
sent, total = hashlib.sha256(), 0
print(json.dumps({"local": list(s.getsockname())}), flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "send":
        n = int(cmd[1])
        payload = os.urandom(n)
        t0 = time.monotonic()
        sender = threading.Thread(target=s.sendall, args=(struct.pack("!Q", n) + payload,))
        sender.start()
        got = bytearray()
        while len(got) < n:
            d = s.recv(min(1 << 20, n - len(got)))
            if not d:
                break
            got += d
        sender.join()
        sent.update(payload)
        total += n
        print(json.dumps({"sent": n, "echoed": len(got), "intact": bytes(got) == payload,
                          "seconds": time.monotonic() - t0}), flush=True)
    elif cmd[0] == "close":
        s.sendall(struct.pack("!Q", 0))
        extra = 0
        while True:
            d = s.recv(65536)
            if not d:
                break
            extra += len(d)
        s.close()
        print(json.dumps({"closed": True, "extra": extra, "bytes": total, "sha256": sent.hexdigest()}), flush=True)
        break
    elif cmd[0] == "reset":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        print(json.dumps({"reset": True}), flush=True)
        break
"""

# UDP client (nx-sub1) of the echo server at HOST:PORT: sockets "a"
# (ordinary checksums) and "b" (SO_NO_CHECK: UDP checksum 0) each send one
# datagram of SIZE bytes per INTERVAL, COUNT times, waiting up to 1 s for
# its echo (and sending once more if none came). Prints its ports first,
# then {"peers": {name: [distinct endpoints the server saw]}, "answered":
# {name: n}, "missing": [...], "resent": n, "seconds": s}.
UDP_CLIENT = r"""
import json, socket, sys, time
server, count, interval, size = (sys.argv[1], int(sys.argv[2])), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
socks = {}
for name, nocheck in (("a", False), ("b", True)):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if nocheck:
        s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_NO_CHECK", 11), 1)
    s.bind(("0.0.0.0", 0))
    s.connect(server)
    s.settimeout(1.0)
    socks[name] = s
print(json.dumps({"ports": {n: s.getsockname()[1] for n, s in socks.items()}}), flush=True)
peers = {n: set() for n in socks}
answered = {n: 0 for n in socks}
missing, resent = [], 0
t0 = time.monotonic()
for i in range(count):
    for name, s in socks.items():
        msg = f"offload-{name}-{i:05d}-".ljust(size, "x")
        for attempt in range(2):
            s.send(msg.encode())
            try:
                while True:
                    reply = json.loads(s.recv(4096))
                    if reply["data"] == msg:
                        break
                peers[name].add(tuple(reply["peer"]))
                answered[name] += 1
                break
            except socket.timeout:
                resent += 1
        else:
            missing.append(msg)
    time.sleep(max(0.0, t0 + (i + 1) * interval - time.monotonic()))
print(json.dumps({"peers": {n: sorted(p) for n, p in peers.items()}, "answered": answered,
                  "missing": missing[:10], "resent": resent, "seconds": time.monotonic() - t0}), flush=True)
"""


class Script:
    """A Python script in a namespace: lines to its stdin, JSON lines from
    its stdout."""

    def __init__(self, ns, script, *args):
        self.ns = ns
        self.proc = subprocess.Popen(h.netns_cmd(ns, sys.executable, "-u", "-c", script, *args),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=h.clean_env())
        self.out = h._Lines(self.proc.stdout)
        self.err = h._Lines(self.proc.stderr)
        self.taken = 0

    def line(self, timeout):
        deadline = time.monotonic() + timeout
        with self.out.cond:
            while len(self.out.lines) <= self.taken:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.out.thread.is_alive()):
                    raise AssertionError(f"script in {self.ns} printed nothing within {timeout} s "
                                         f"(status {self.proc.poll()}):\n{self.err.text()[-3000:]}")
                self.out.cond.wait(timeout=min(left, 0.2))
            text = self.out.lines[self.taken]
            self.taken += 1
        return json.loads(text)

    def has_line(self):
        with self.out.cond:
            return len(self.out.lines) > self.taken

    def cmd(self, text, timeout):
        self.proc.stdin.write((text + "\n").encode())
        self.proc.stdin.flush()
        return self.line(timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)


@pytest.fixture
def scripts():
    started = []

    def start(ns, script, *args):
        s = Script(ns, script, *map(str, args))
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def tcp_server(scripts):
    srv = scripts(NS_SRV1, TCP_SERVER, TCP_PORT)
    assert srv.line(10) == {"listening": TCP_PORT}
    return srv


# --- natrix's API, from inside nx-nat --------------------------------------------

def api(path, method="GET"):
    r = h.run_in(NS_NAT, "curl", "-sS", "-f", "--noproxy", "*", "-m", "5", "-X", method,
                 f"http://{h.DEFAULT_API}{path}", timeout=10)
    assert r.returncode == 0, f"{method} {path}: {r.stderr.strip()} {r.stdout[:500]}"
    return r.stdout


def stats():
    return json.loads(api("/api/stats"))


NONE_RETURNED = dict.fromkeys(("frame", "not_steady", "idle", "next_hop", "egress", "gone", "reset"), 0)


def offloaded():
    doc = stats()
    assert "offloaded" in doc, f"/api/stats has no \"offloaded\": {doc}"
    return doc["offloaded"]


def sessions(subscriber):
    return json.loads(api(f"/api/sessions?subscriber={subscriber}"))


def metrics():
    """/metrics as {(name, ((label, value), ...)): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(api("/metrics")) for s in fam.samples}


def wait_for(what, timeout, step=0.1):
    """Polls what() until it returns something true or `timeout` passes;
    returns (last value, seconds waited)."""
    t0 = time.monotonic()
    while True:
        got = what()
        if got or time.monotonic() - t0 >= timeout:
            return got, time.monotonic() - t0
        time.sleep(step)


def tx_packets(ns, dev="eth0"):
    """Frames the kernel of `ns` sent on `dev` (its veth counter)."""
    link = json.loads(h.sh("ip", "-j", "-s", "link", "show", "dev", dev, ns=ns).stdout)[0]
    return link["stats64"]["tx"]["packets"]


def announced(n):
    """The directions natrix's start-up says XDP forwards: {(from, to): table size}."""
    return {(m.group(1), m.group(2)): int(m.group(3)) for m in FORWARDED.finditer(n.err.text())}


def assert_announced(n):
    got = announced(n)
    assert got == {("inside", "outside"): 131072, ("outside", "inside"): 131072}, (
        f"natrix should say that established flows in both directions are forwarded by XDP "
        f"(up to 131072 flow directions); it said {got}\n{n.output()}")


def assert_programs_in(n, mode):
    """natrix says its XDP programs run in `mode` and `ip` in nx-nat shows
    them so (`xdpgeneric`, or `xdp` for native)."""
    said = f"XDP programs in {mode} mode on inside and outside"
    assert said in n.err.text(), f"natrix should say {said!r}:\n{n.output()}"
    want = "xdpgeneric" if mode == "generic" else "xdp"
    for dev in ("inside", "outside"):
        shown = h.sh("ip", "-d", "link", "show", dev, ns=NS_NAT).stdout.split()
        assert want in shown, f"`ip -d link show {dev}` in {NS_NAT} should show {want}: {shown}"


def decode(path, display_filter, *fields):
    """tshark's decoding of a capture, checksums verified: one list of
    `fields` per frame matching `display_filter`."""
    out = subprocess.run(["tshark", "-r", str(path), "-o", "ip.check_checksum:TRUE",
                          "-o", "tcp.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
                          "-Y", display_filter, "-T", "fields", "-E", "occurrence=f",
                          *[a for f in fields for a in ("-e", f)]],
                         capture_output=True, text=True, timeout=120, env=h.clean_env())
    assert out.returncode == 0, f"tshark -r {path}: {out.stderr}"
    return [(line.split("\t") + [""] * len(fields))[:len(fields)] for line in out.stdout.splitlines()]


GOOD = "1"  # tshark's checksum status: 0 bad, 1 good, 2 unverified, 3 not present


def gro(state):
    """GRO `state` ("on"/"off") on both peers, trying both whatever fails."""
    failed = [f"{peer}: {p.stderr.strip()}" for peer in PEERS
              if (p := h.sh("ethtool", "-K", peer, "gro", state, ns=SWITCH, check=False)).returncode != 0]
    assert not failed, f"ethtool -K PEER gro {state} in {SWITCH} failed: {failed}"


def gro_states():
    out = {}
    for peer in PEERS:
        m = re.search(r"generic-receive-offload: (\w+)", h.sh("ethtool", "-k", peer, ns=SWITCH).stdout)
        out[peer] = m and m.group(1)
    return out


# --- tests ---------------------------------------------------------------------------

WARM = 1 << 20
BULK = 4 << 20


@needs_xdp
@needs_tshark
@pytest.mark.parametrize("xdp_mode", ["native", "generic"])
def test_bulk_tcp_is_forwarded_by_xdp_intact(natrix, scripts, tmp_path, xdp_mode):
    """A TCP connection echoes 1 MiB, then 4 MiB while tshark captures at
    both ends: every byte comes back and the server hashed the same bytes,
    from a pool address; during the 4 MiB, XDP forwarded at least 90 % of
    the frames each kernel sent (`offloaded.to_outside` against the
    client's veth counter, `to_inside` against the server's), `translated`
    and the interfaces' counters include them, and the table holds flows
    while the connection is open. Every captured frame arrives with its
    sender's TTL less one, and the unmerged ones (the switch's GRO merges
    some) with IPv4 and TCP checksums tshark verifies. With the programs
    in native mode (veth's driver runs them) and in generic mode (the
    kernel runs them on each frame's skb), as `ip` shows them."""
    n = natrix({**XDP, "xdp_mode": xdp_mode})
    assert_announced(n)
    assert_programs_in(n, xdp_mode)
    srv = tcp_server(scripts)
    cli = scripts(NS_SUB1, TCP_CLIENT, SRV1, TCP_PORT, 0)
    local = cli.line(10)["local"]
    warm = cli.cmd(f"send {WARM}", timeout=60)
    assert warm["intact"], f"the first 1 MiB did not come back intact: {warm}"
    flows, waited = wait_for(lambda: offloaded()["flows"], 2.0)
    assert flows > 0, f"an established TCP connection that echoed 1 MiB has no flow in the XDP table after {waited:.1f} s: {stats()}"

    before, sub_tx, srv_tx = stats(), tx_packets(NS_SUB1), tx_packets(NS_SRV1)
    bpf = f"tcp port {TCP_PORT}"
    caps = {ns: h.Tshark(ns, "eth0", bpf, tmp_path / f"{ns}.pcapng") for ns in (NS_SUB1, NS_SRV1)}
    try:
        bulk = cli.cmd(f"send {BULK}", timeout=60)
    finally:
        for c in caps.values():
            c.stop()
    assert bulk["intact"], f"4 MiB did not come back intact through the offload: {bulk}"
    sub_tx, srv_tx = tx_packets(NS_SUB1) - sub_tx, tx_packets(NS_SRV1) - srv_tx

    def grown():
        s = stats()
        d = {k: s["offloaded"][k] - before["offloaded"][k] for k in ("to_inside", "to_outside")}
        return (s, d) if d["to_outside"] >= 0.9 * sub_tx and d["to_inside"] >= 0.9 * srv_tx else None
    got, waited = wait_for(grown, 3.0, step=0.2)
    after = stats()
    d = {k: after["offloaded"][k] - before["offloaded"][k] for k in ("to_inside", "to_outside")}
    assert got, (f"XDP forwarded {d} frames of a 4 MiB echo, while the client's kernel sent {sub_tx} and "
                 f"the server's {srv_tx} (at least 90 % expected)\nbefore {before['offloaded']}, after {after['offloaded']}")
    assert after["offloaded"]["flows"] > 0, f"no flow in the XDP table while the connection is open: {after}"
    for way in ("to_inside", "to_outside"):
        tr = after["translated"][way] - before["translated"][way]
        assert tr >= d[way], f"translated.{way} grew by {tr}, less than the {d[way]} frames XDP forwarded that way"
    rx_in = after["interfaces"]["inside"]["rx_packets"] - before["interfaces"]["inside"]["rx_packets"]
    tx_out = after["interfaces"]["outside"]["tx_packets"] - before["interfaces"]["outside"]["tx_packets"]
    assert rx_in >= 0.9 * sub_tx, f"inside rx_packets grew by {rx_in}, the client sent {sub_tx}: offloaded frames not counted"
    assert tx_out >= d["to_outside"], f"outside tx_packets grew by {tx_out}, XDP sent {d['to_outside']} there"
    took = sum(w["received_frames"] for w in after["per_worker"]) - sum(w["received_frames"] for w in before["per_worker"])
    assert took <= 0.1 * (sub_tx + srv_tx), (
        f"natrix's workers took {took} frames from their queues while the kernels sent {sub_tx + srv_tx} "
        "through it: offloaded frames should never reach them")

    fields = ("ip.src", "ip.dst", "ip.ttl", "ip.len", "ip.checksum.status", "tcp.checksum.status")
    at = {ns: decode(c.path, "tcp", *fields) for ns, c in caps.items()}
    sent_ttl = {src: {int(f[2]) for f in at[ns] if f[0] == src} for ns, src in ((NS_SUB1, SUB1), (NS_SRV1, SRV1))}
    for src, ttls in sent_ttl.items():
        assert len(ttls) == 1, f"{src} sent segments with TTLs {ttls} (one expected)"
    for ns, src in ((NS_SRV1, None), (NS_SUB1, SRV1)):
        arrived = [f for f in at[ns] if (f[0] == src if src else h.in_pool(f[0], n.pool))]
        sender = src or SUB1
        want = next(iter(sent_ttl[sender])) - 1
        assert len(arrived) >= 100, f"tshark in {ns} saw only {len(arrived)} segments from {sender} through natrix"
        bad_ttl = [f for f in arrived if int(f[2]) != want]
        assert not bad_ttl, f"{len(bad_ttl)} segments from {sender} reached {ns} with a TTL other than {want}: {bad_ttl[:5]}"
        whole = [f for f in arrived if int(f[3]) <= 1500]
        assert len(whole) >= 10, f"tshark in {ns} saw only {len(whole)} unmerged segments from {sender}"
        bad = [f for f in whole if f[4] != GOOD or f[5] != GOOD]
        assert not bad, f"{len(bad)} of {len(whole)} segments from {sender} reached {ns} with a bad checksum: {bad[:5]}"

    closed = cli.cmd("close", timeout=20)
    seen = srv.line(10)
    assert seen["status"] == "closed", seen
    assert h.in_pool(seen["peer"][0], n.pool), f"the server saw the connection from {seen['peer']}, not a pool address"
    assert seen["bytes"] == WARM + BULK and seen["sha256"] == closed["sha256"], (
        f"the server received other bytes than the client sent: {seen} vs {closed}")
    assert closed["extra"] == 0, closed
    print(f"client {local}, server saw {seen['peer']}; 4 MiB echo: {bulk['seconds']:.2f} s, offloaded {d}, "
          f"kernels sent {sub_tx} (client) and {srv_tx} (server)")


@needs_xdp
def test_closed_connection_leaves_the_table_and_reopens(natrix, scripts):
    """An offloaded connection that ends with FIN both ways (the server's
    first) leaves the XDP table within 2.5 s (it holds nothing else); a new
    connection from the same client port to the same server then works,
    whole, and is offloaded in its turn. A third, ended by the client's
    RST, leaves the table as quickly: both directions as the RST passes."""
    n = natrix(XDP)
    srv = tcp_server(scripts)
    port = random.randint(40000, 49999)
    size = 512 * 1024
    for round_, ending in ((1, "close"), (2, "close"), (3, "reset")):
        if ending == "reset":
            port = random.randint(40000, 49999)
        before = offloaded()
        cli = scripts(NS_SUB1, TCP_CLIENT, SRV1, TCP_PORT, port)
        local = cli.line(10)["local"]
        assert local == [SUB1, port], local
        r = cli.cmd(f"send {size}", timeout=60)
        assert r["intact"], f"connection {round_} from port {port}: 512 KiB did not come back intact: {r}"

        def learned():
            o = offloaded()
            return o if o["flows"] > 0 and o["to_outside"] > before["to_outside"] else None
        got, waited = wait_for(learned, 2.0)
        assert got, (f"connection {round_} from port {port} was never offloaded "
                     f"(before {before}, now {offloaded()})")
        closed = cli.cmd(ending, timeout=20)
        seen = srv.line(10)
        if ending == "close":
            assert seen["status"] == "closed" and seen["sha256"] == closed["sha256"], (seen, closed)
        else:
            assert "ConnectionResetError" in seen["status"], f"the server did not get the client's RST: {seen}"
        assert h.in_pool(seen["peer"][0], n.pool), seen
        left, waited = wait_for(lambda: offloaded()["flows"] == 0, 2.5)
        how = "with FIN both ways" if ending == "close" else "with the client's RST"
        assert left, (f"after connection {round_} ended {how}, the XDP table still holds "
                      f"{offloaded()['flows']} flows {waited:.1f} s later")
        returned = {k: v - before["returned"][k] for k, v in offloaded()["returned"].items()}
        assert returned["frame"] == 2 and sum(returned.values()) == 2, (
            f"the two directions leave the table once each, as the FIN or RST reaching the engine hands them back: {returned}")
        print(f"connection {round_} ({ending}): table empty {waited:.2f} s after")


UDP_COUNT, UDP_INTERVAL, UDP_SIZE = 240, 0.025, 48
FRAGMENTED = 3000  # bytes of UDP payload: three fragments on a 1500-byte link


@needs_xdp
@needs_tshark
def test_long_udp_flow_runs_on_xdp_and_keeps_its_session_fresh(natrix, servers, scripts, tmp_path):
    """Two UDP sockets (one with ordinary checksums, one sending checksum 0)
    each echo 240 datagrams of 48 bytes through the echo server, one per
    25 ms (6 s): every echo comes back with its payload, each socket has one
    external endpoint in the pool all along; XDP forwarded at least 90 % of
    the datagrams both ways and holds 4 flow directions; `/api/sessions`
    shows both sessions with `idle_s` <= 2 from 2.5 s into the flow on (the
    engine sees hardly any of their frames, so only XDP's counts keep them
    fresh); the metrics agree with /api/stats. tshark: every datagram
    arrives with its sender's TTL less one and verified IPv4 and UDP
    checksums, those sent with checksum 0 arrive with 0. Once the flow
    stops, its flow directions leave the table after 10 s (9 to 14 s
    accepted), when the sessions show idle_s >= 8."""
    n = natrix(XDP)
    assert_announced(n)
    before = stats()
    bpf = f"udp port {h.UDP_ECHO}"
    caps = {ns: h.Tshark(ns, "eth0", bpf, tmp_path / f"{ns}.pcapng") for ns in (NS_SUB1, NS_SRV1)}
    samples = []  # (seconds into the flow, socket, idle_s, outside) from /api/sessions
    flows_seen = 0
    try:
        cli = scripts(NS_SUB1, UDP_CLIENT, SRV1, h.UDP_ECHO, UDP_COUNT, UDP_INTERVAL, UDP_SIZE)
        ports = cli.line(10)["ports"]
        t0 = time.monotonic()
        while not cli.has_line() and cli.proc.poll() is None and time.monotonic() - t0 < 30:
            time.sleep(0.5)
            at = time.monotonic() - t0
            rows = sessions(SUB1)
            for name, port in ports.items():
                row = [r for r in rows if r["inside"] == f"{SUB1}:{port}" and r["remote"] == f"{SRV1}:{h.UDP_ECHO}"]
                samples.append((at, name, row[0]["idle_s"] if row else None, row[0]["outside"] if row else None))
            flows_seen = max(flows_seen, offloaded()["flows"])
        result = cli.line(20)
        flow_ended = time.monotonic()
        idle_before = offloaded()["returned"]["idle"]
        end = stats()
        m = metrics()
    finally:
        for c in caps.values():
            c.stop()

    assert not result["missing"] and result["answered"] == {"a": UDP_COUNT, "b": UDP_COUNT}, (
        f"echoes missing after a second try: {result}")
    assert result["resent"] <= 2, f"{result['resent']} datagrams needed a second try: {result}"
    external = {}
    for name, peers in result["peers"].items():
        assert len(peers) == 1, f"socket {name} reached the server from {peers}: its external endpoint changed"
        external[name] = tuple(peers[0])
        assert h.in_pool(external[name][0], n.pool), f"socket {name} reached the server from {external[name]}"

    d = {k: end["offloaded"][k] - before["offloaded"][k] for k in ("to_inside", "to_outside")}
    want = 0.9 * 2 * UDP_COUNT - 16
    assert d["to_outside"] >= want and d["to_inside"] >= want, (
        f"XDP forwarded {d} of the {2 * UDP_COUNT} datagrams each way (at least {want:.0f} expected)")
    assert max(flows_seen, end["offloaded"]["flows"]) >= 4, (
        f"two UDP flows both ways are 4 flow directions; the table held at most {flows_seen} during the flow, "
        f"{end['offloaded']['flows']} after")

    flow_end = result["seconds"]
    for name in ports:
        mine = [s for s in samples if s[1] == name]
        assert all(s[2] is not None for s in mine), f"socket {name}'s session missing from /api/sessions at times: {mine}"
        assert all(s[3] == f"{external[name][0]}:{external[name][1]}" for s in mine), (
            f"/api/sessions shows socket {name}'s session with another external endpoint than the server saw "
            f"({external[name]}): {mine}")
        late = [s for s in mine if 2.5 <= s[0] <= flow_end - 0.3]
        assert len(late) >= 3, f"too few /api/sessions samples late in the flow: {samples}"
        stale = [s for s in late if s[2] > 2]
        assert not stale, (f"socket {name}'s session shows idle_s > 2 while its flow runs on XDP "
                           f"(the engine is not refreshed from XDP's counts): {stale}")

    def metric(name, **labels):
        return m.get((name, tuple(sorted(labels.items()))))
    for iface, way in (("outside", "to_outside"), ("inside", "to_inside")):
        pkts = metric("natrix_offloaded_packets_total", interface=iface)
        octets = metric("natrix_offloaded_bytes_total", interface=iface)
        trans = metric("natrix_translated_packets_total", interface=iface)
        assert pkts is not None and octets is not None, f"no natrix_offloaded_*_total{{interface=\"{iface}\"}} in /metrics"
        assert pkts >= end["offloaded"][way], f"natrix_offloaded_packets_total{{{iface}}} {pkts} < /api/stats {way} {end['offloaded'][way]}"
        assert 54 * pkts <= octets <= 1514 * pkts, f"natrix_offloaded_bytes_total{{{iface}}} {octets} for {pkts} frames"
        assert trans is not None and trans >= pkts, f"natrix_translated_packets_total{{{iface}}} {trans} < offloaded {pkts}"
    gauge = metric("natrix_offload_flows")
    assert gauge is not None and gauge >= 4, f"natrix_offload_flows {gauge} right after two UDP flows ran both ways"

    fields = ("ip.src", "ip.dst", "udp.srcport", "udp.dstport", "ip.ttl", "ip.checksum.status",
              "udp.checksum", "udp.checksum.status")
    at = {ns: decode(c.path, "udp", *fields) for ns, c in caps.items()}
    ttl_of = {}
    for ns, src in ((NS_SUB1, SUB1), (NS_SRV1, SRV1)):
        ttls = {int(f[4]) for f in at[ns] if f[0] == src}
        assert len(ttls) == 1, f"{src} sent datagrams with TTLs {ttls}"
        ttl_of[src] = ttls.pop()
    engine_sums = {}
    for name in ports:
        ext = external[name]
        arrived = [f for f in at[NS_SRV1] if (f[0], int(f[2])) == ext and f[1] == SRV1]
        assert len(arrived) >= UDP_COUNT, f"tshark in {NS_SRV1} saw {len(arrived)} datagrams of socket {name}"
        assert all(int(f[4]) == ttl_of[SUB1] - 1 for f in arrived), (
            f"socket {name}'s datagrams reached the server with TTLs {sorted({f[4] for f in arrived})}, "
            f"sent with {ttl_of[SUB1]}")
        assert all(f[5] == GOOD for f in arrived), f"bad IPv4 checksums at the server: {[f for f in arrived if f[5] != GOOD][:5]}"
        if name == "a":
            bad = [f for f in arrived if f[7] != GOOD]
            assert not bad, f"{len(bad)} datagrams reached the server with a UDP checksum tshark does not verify: {bad[:5]}"
        else:
            assert not [f for f in arrived if f[7] == "0"], f"a checksum-0 datagram arrived with a bad checksum: {arrived[:5]}"
            engine_sums[name] = sum(int(f[6], 16) != 0 for f in arrived[:10])
            nonzero = [f for f in arrived[10:] if int(f[6], 16) != 0]
            assert not nonzero, (f"{len(nonzero)} datagrams sent with UDP checksum 0 reached the server with "
                                 f"another checksum (a UDP checksum of 0 must stay 0): {nonzero[:5]}")
    back = [f for f in at[NS_SUB1] if f[0] == SRV1 and f[1] == SUB1]
    assert len(back) >= 2 * UDP_COUNT, f"tshark in {NS_SUB1} saw {len(back)} echoes"
    assert all(int(f[4]) == ttl_of[SRV1] - 1 for f in back), (
        f"echoes reached the client with TTLs {sorted({f[4] for f in back})}, sent with {ttl_of[SRV1]}")
    bad = [f for f in back if f[5] != GOOD or f[7] != GOOD]
    assert not bad, f"{len(bad)} echoes reached the client with a bad checksum: {bad[:5]}"
    assert {int(f[3]) for f in back} == set(ports.values()), "echoes addressed to other ports than the client's"

    # Idle: no frame since the flow ended, so its 4 directions leave the
    # table after 10 s, and the sessions' idle_s has grown meanwhile.
    while time.monotonic() - flow_ended < 14 and offloaded()["flows"] > 0:
        time.sleep(0.25)
    idle_gone = time.monotonic() - flow_ended
    rows = {r["inside"]: r for r in sessions(SUB1)}
    assert offloaded()["flows"] == 0, f"the idle flows are still in the XDP table {idle_gone:.1f} s after the flow ended"
    assert idle_gone >= 9, f"the flows left the XDP table {idle_gone:.1f} s after their last frame (10 s of idleness expected)"
    assert offloaded()["returned"]["idle"] - idle_before == 4, f"the 4 directions go back as idle: {offloaded()['returned']}"
    for name, port in ports.items():
        row = rows.get(f"{SUB1}:{port}")
        assert row and row["idle_s"] >= 8, (f"{idle_gone:.1f} s after its last frame, socket {name}'s session shows "
                                            f"idle_s {row and row['idle_s']}: {row}")
    print(f"UDP flow {result['seconds']:.1f} s, external {external}, offloaded {d}, idle_s samples "
          f"{[(round(s[0], 1), s[1], s[2]) for s in samples]}; table empty {idle_gone:.1f} s after the last frame; "
          f"of socket b's first 10 datagrams {engine_sums.get('b')} arrived with a checksum other than 0")


@needs_xdp
def test_offload_false_keeps_every_frame_in_the_engine(natrix, servers, scripts):
    """`offload = false`: natrix does not announce the offload, a UDP echo
    flow (60 datagrams per socket) works, and nothing is offloaded: the
    `offloaded` counters, the metrics and the table stay at 0 while
    `translated` counts every datagram."""
    n = natrix({**XDP, "offload": False})
    assert "forwarded by XDP" not in n.err.text(), f"offload = false, yet natrix announces it:\n{n.output()}"
    before = stats()
    cli = scripts(NS_SUB1, UDP_CLIENT, SRV1, h.UDP_ECHO, 60, 0.01, UDP_SIZE)
    cli.line(10)
    result = cli.line(30)
    assert not result["missing"] and all(len(p) == 1 for p in result["peers"].values()), result
    time.sleep(1.2)  # the workers read XDP's counts once a second
    after = stats()
    zero = {"flows": 0, "table_full": 0, "to_inside": 0, "to_outside": 0, "egress": {"inside": False, "outside": False}, "returned": NONE_RETURNED}
    assert after.get("offloaded", zero) == zero, f"offload = false, yet /api/stats says {after.get('offloaded')}"
    for way in ("to_inside", "to_outside"):
        grew = after["translated"][way] - before["translated"][way]
        assert grew >= 120, f"translated.{way} grew by {grew} for 120 datagrams"
    m = metrics()
    off = {k: v for k, v in m.items() if k[0].startswith("natrix_offload")}
    assert all(v == 0 for v in off.values()), f"offload = false, yet the metrics say {off}"


@needs_xdp
def test_clear_and_reload_hand_flows_back_to_the_engine(natrix, agent, servers):
    """A UDP flow is offloaded; `POST /api/clear?subscriber=` empties the XDP
    table within 2 s and the subscriber's sessions are gone; the flow's next
    datagrams are the engine's again (a session for them appears in
    /api/sessions, with the external endpoint the server now sees) and are
    offloaded anew; SIGHUP (same file) empties the table again, and the
    flow goes on with its session and endpoint."""
    n = natrix(XDP)
    sub = agent(NS_SUB1)
    opened = sub.call("udp_open")
    sid, port = opened["sid"], opened["local"][1]
    echo = (SRV1, h.UDP_ECHO)

    def burst(tag, count=16):
        seen = {sub.echo(sid, echo, f"{tag}-{i:04d}".ljust(UDP_SIZE, "x")) for i in range(count)}
        assert len(seen) == 1, f"{tag}: the server saw the flow from {seen}"
        return seen.pop()

    def my_sessions():
        return [r for r in sessions(SUB1) if r["inside"] == f"{SUB1}:{port}" and r["remote"] == f"{SRV1}:{h.UDP_ECHO}"]

    e1 = burst("before-clear")
    got, _ = wait_for(lambda: offloaded()["flows"] >= 2, 2.0)
    assert got, f"a UDP flow of 16 echoes was not offloaded both ways: {offloaded()}"
    assert [r["outside"] for r in my_sessions()] == [f"{e1[0]}:{e1[1]}"], my_sessions()

    resets = offloaded()["returned"]["reset"]
    cleared = json.loads(api(f"/api/clear?subscriber={SUB1}", "POST"))
    assert cleared.get("sessions", 0) >= 1, cleared
    emptied, waited = wait_for(lambda: offloaded()["flows"] == 0, 2.0)
    assert emptied, f"the XDP table still holds {offloaded()['flows']} flows {waited:.1f} s after clearing {SUB1}"
    assert offloaded()["returned"]["reset"] >= resets + 2, f"a clear hands flows back as a reset: {offloaded()['returned']}"
    assert sessions(SUB1) == [], f"sessions of {SUB1} left after the clear: {sessions(SUB1)}"
    clear_s = waited

    e2 = burst("after-clear")
    rows = my_sessions()
    assert [r["outside"] for r in rows] == [f"{e2[0]}:{e2[1]}"], (
        f"after the clear, the flow's datagrams (seen by the server from {e2}) made no session in the "
        f"engine: /api/sessions for {SUB1} has {sessions(SUB1)}")
    got, _ = wait_for(lambda: offloaded()["flows"] >= 2, 2.0)
    assert got, f"the flow was not offloaded again after the clear: {offloaded()}"

    resets = offloaded()["returned"]["reset"]
    n.signal(signal.SIGHUP)
    emptied, waited = wait_for(lambda: offloaded()["flows"] == 0, 2.5)
    assert emptied, f"the XDP table still holds {offloaded()['flows']} flows {waited:.1f} s after SIGHUP"
    assert offloaded()["returned"]["reset"] >= resets + 2, f"a reload hands flows back as a reset: {offloaded()['returned']}"
    assert n.alive(), n.output()
    assert burst("after-reload", 4) == e2, "the flow's external endpoint changed on SIGHUP"
    assert [r["outside"] for r in my_sessions()] == [f"{e2[0]}:{e2[1]}"], my_sessions()
    print(f"external {e1} before the clear, {e2} after; table empty {clear_s:.2f} s after the clear, "
          f"{waited:.2f} s after SIGHUP")


# UDP prober (nx-sub1), connected to HOST:PORT with IP_RECVERR: per stdin
# line "echo DATA", "ttl1 DATA" (sent with TTL 1) or "opts DATA" (sent with
# IP options: NOP, NOP, NOP, end), sends DATA and prints {"reply": DATA}
# once echoed or {"error": errno name} (1 s to wait).
UDP_PROBE = r"""
import errno, json, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_RECVERR", 11), 1)
s.connect((sys.argv[1], int(sys.argv[2])))
s.settimeout(1.0)
for line in sys.stdin:
    cmd, data = line.rstrip("\n").split(" ", 1)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 1 if cmd == "ttl1" else 64)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, b"\x01\x01\x01\x00" if cmd == "opts" else b"")
    s.send(data.encode())
    try:
        while True:
            reply = json.loads(s.recv(65535))
            if reply["data"] == data:
                print(json.dumps({"reply": len(data)}), flush=True)
                break
    except socket.timeout:
        print(json.dumps({"error": "TIMEOUT"}), flush=True)
    except OSError as e:
        print(json.dumps({"error": errno.errorcode.get(e.errno, str(e.errno))}), flush=True)
"""


@needs_xdp
def test_frames_the_offload_never_takes_stay_with_the_engine(natrix, agent, servers, scripts):
    """Frames shorter than 54 bytes: 30 echoes with an 11-byte payload (53-byte
    requests; the echo server's answers are longer) leave `to_outside` at 0
    while the answers are offloaded. On an offloaded flow, a datagram
    with TTL 1, one with IP options and a 3000-byte one (fragments) are not
    forwarded by XDP (`to_outside` unchanged): the TTL 1 one never reaches
    the server and the client hears ICMP time exceeded (EHOSTUNREACH) from
    the engine, the fragmented one comes back whole; the flow goes on."""
    natrix(XDP)
    sub = agent(NS_SUB1)
    echo = (SRV1, h.UDP_ECHO)
    short = sub.udp_open()
    for i in range(30):
        sub.echo(short, echo, f"s{i:010d}")
    time.sleep(1.2)
    o = offloaded()
    assert o["to_outside"] == 0, f"53-byte frames were forwarded by XDP: {o}"
    assert o["to_inside"] >= 10, f"the longer answers were not offloaded, so the check above proves nothing: {o}"

    cli = scripts(NS_SUB1, UDP_PROBE, SRV1, h.UDP_ECHO)
    for i in range(16):
        r = cli.cmd("echo " + f"normal-{i:04d}".ljust(UDP_SIZE, "x"), timeout=5)
        assert r.get("reply"), r
    got, _ = wait_for(lambda: offloaded()["to_outside"] > 0, 2.0)
    assert got, f"the probing flow was not offloaded: {offloaded()}"
    time.sleep(1.2)
    before = offloaded()
    opts = cli.cmd("opts " + "options-probe".ljust(UDP_SIZE, "x"), timeout=5)
    frag = cli.cmd("echo " + "fragment-probe".ljust(FRAGMENTED, "x"), timeout=5)
    # Still offloaded, so that the datagrams above met an offloaded flow;
    # the TTL 1 one, which the engine answers itself, goes last.
    assert offloaded()["flows"] >= before["flows"], f"the flow left the table before its probes were done: {before} -> {offloaded()}"
    ttl1 = cli.cmd("ttl1 " + "ttl-one-probe".ljust(UDP_SIZE, "x"), timeout=5)
    time.sleep(1.2)
    after = offloaded()
    events = servers[SRV1].events(servers[SRV1].server_ids["udp_echo"])
    assert not [e for e in events if e["data"].startswith("ttl-one-probe")], "a TTL 1 datagram reached the server"
    assert after["to_outside"] == before["to_outside"], (
        f"XDP forwarded one of the TTL 1, IP options or fragmented datagrams: {before} -> {after}")
    assert ttl1.get("error") == "EHOSTUNREACH", f"the client heard no time exceeded for its TTL 1 datagram: {ttl1}"
    assert frag.get("reply") == FRAGMENTED, f"a {FRAGMENTED}-byte datagram (fragments both ways) did not come back: {frag}"
    assert opts.get("reply"), f"the datagram with IP options did not come back: {opts}"
    r = cli.cmd("echo " + "still-there".ljust(UDP_SIZE, "x"), timeout=5)
    assert r.get("reply"), r
    print(f"short frames: {o}; TTL 1: {ttl1}; IP options: {opts}; fragments: {frag}; {before} -> {after}")


def refused(lab, tmp_path, overrides, name):
    """Starts natrix with `overrides` expecting it to exit before 'ready';
    returns its output."""
    bad = h.Natrix(h.deep_merge(lab, overrides), tmp_path / f"{name}.toml")
    try:
        bad.wait_ready(timeout=20)
        started = True
    except (RuntimeError, TimeoutError):
        started = False
    rc = bad.stop()
    assert not started, f"natrix started with {overrides}; it must refuse\n{bad.output()}"
    assert rc not in (0, None), f"natrix exited with {rc} refusing {overrides}\n{bad.output()}"
    return bad.out.text() + "\n" + bad.err.text()


@needs_xdp
@needs_ethtool
def test_offload_needs_peers_that_take_redirects(lab, natrix, agent, servers, tmp_path):
    """With GRO off on nx-sw's nx-nat-in and nx-nat-out, neither of natrix's
    veths takes a native program's XDP redirects (`xdp_mode = "native"`;
    generic programs need no GRO, as the next test shows): `offload = true` is refused naming the
    interface and `offload = true`; "auto" starts with a note that the
    offload is off, naming both interfaces and `gro on`, and forwards
    without it. With GRO on again (restored whatever happens) a new natrix
    announces the offload and offloads a flow."""
    was = gro_states()
    assert was == {p: "on" for p in PEERS}, f"`natrix lab up` should leave GRO on on {PEERS}: {was}"
    echo = (SRV1, h.UDP_ECHO)
    try:
        gro("off")
        assert gro_states() == {p: "off" for p in PEERS}, gro_states()
        out = refused(lab, tmp_path, {**NATIVE, "offload": True}, "offload-true")
        assert "offload = true" in out and ("inside" in out or "outside" in out), (
            f"the refusal should name `offload = true` and the interface:\n{out}")
        n = natrix(NATIVE)
        notes = [line for line in n.err.text().splitlines() if "offload: off" in line]
        assert notes, f"no `offload: off` note with GRO off on both peers:\n{n.output()}"
        note = notes[0]
        for needle in ("neither interface takes frames redirected from XDP", "inside", "outside", "gro on"):
            assert needle in note, f"the note lacks {needle!r}: {note}"
        assert not announced(n), f"natrix announces the offload it cannot do:\n{n.output()}"
        sub = agent(NS_SUB1)
        sid = sub.udp_open()
        for i in range(16):
            sub.echo(sid, echo, f"no-offload-{i:04d}".ljust(UDP_SIZE, "x"))
        time.sleep(1.2)
        o = offloaded()
        assert o == {"flows": 0, "table_full": 0, "to_inside": 0, "to_outside": 0, "egress": {"inside": False, "outside": False}, "returned": NONE_RETURNED}, f"offload off, yet {o}"
        rc = n.stop()
        n.reported = True
        assert rc == 0, f"natrix exited with {rc} on SIGTERM\n{n.output()}"
    finally:
        gro("on")
    assert gro_states() == was, gro_states()
    print(f"refusal: {[line for line in out.splitlines() if 'offload' in line]}; note: {note}")
    n = natrix(NATIVE)
    assert_announced(n)
    sub = agent(NS_SUB1)
    sid = sub.udp_open()
    for i in range(16):
        sub.echo(sid, echo, f"offload-back-{i:04d}".ljust(UDP_SIZE, "x"))
    got, _ = wait_for(lambda: offloaded()["flows"] > 0, 2.0)
    assert got, f"with GRO back on, a UDP flow was not offloaded: {offloaded()}"


@needs_xdp
@needs_ethtool
def test_generic_programs_offload_to_peers_without_napi(natrix, agent, servers):
    """A generic program's redirects leave through the kernel's transmit
    path, which any interface takes: with GRO off on nx-sw's peers (no
    veth takes a native program's redirects then, as the test above
    shows), `xdp_mode = "generic"` still announces the offload both ways
    and a UDP echo flow is forwarded by XDP, every answer intact. natrix
    leaves the devices' deferral alone (`prefer_busy_poll = "auto"`) and
    says why."""
    was = gro_states()
    echo = (SRV1, h.UDP_ECHO)
    try:
        gro("off")
        # One worker: the deferral the note is about is for one worker or per-queue workers.
        n = natrix({**XDP, "xdp_mode": "generic", "workers": 1})
        assert_announced(n)
        assert_programs_in(n, "generic")
        assert "the devices are left as they are" in n.err.text(), f"no note on prefer_busy_poll:\n{n.output()}"
        sub = agent(NS_SUB1)
        sid = sub.udp_open()
        # echo() returns each answer's view of the sender, having checked its payload.
        seen = {sub.echo(sid, echo, f"generic-{i:04d}".ljust(UDP_SIZE, "x")) for i in range(48)}
        assert len(seen) == 1 and h.in_pool(next(iter(seen))[0], n.pool), f"the server saw the flow from {seen}, not one pool endpoint"
        o, _ = wait_for(lambda: (lambda d: d if d["flows"] > 0 and d["to_outside"] > 0 and d["to_inside"] > 0 else None)(offloaded()), 2.0)
        assert o, f"a UDP echo flow was not forwarded by XDP both ways with generic programs: {offloaded()}"
        assert o["egress"] == {"inside": True, "outside": True}, o
    finally:
        gro("on")
    assert gro_states() == was, gro_states()


def gro_on_peer(peer, state):
    h.sh("ethtool", "-K", peer, "gro", state, ns=SWITCH)


@needs_xdp
@needs_ethtool
def test_an_interface_that_stops_taking_redirects_gets_its_flows_back(natrix, agent, servers):
    """README, "Flow offload": natrix reads the interfaces' XDP features
    again once a second (native programs, `xdp_mode = "native"`). GRO turned off on nx-sw's nx-nat-out while a UDP
    echo flow runs on XDP (where the kernel would drop what the program
    redirects to outside): within 3 s `natrix_offload_egress` and
    /api/stats say outside takes no redirects, only the flow direction to
    inside stays in the table, and 40 echoes in a row are each answered
    at the first try. With GRO on again, both directions are offloaded
    again."""
    n = natrix(NATIVE)
    assert_announced(n)
    sub = agent(NS_SUB1)
    sid = sub.udp_open()
    echo = (SRV1, h.UDP_ECHO)
    sent = 0

    def echoes(count, tries=3):
        nonlocal sent
        for _ in range(count):
            sub.echo(sid, echo, f"egress-{sent:05d}".ljust(UDP_SIZE, "x"), tries=tries)
            sent += 1

    def egress():
        m = metrics()
        return {side: m.get(("natrix_offload_egress", (("interface", side),))) for side in ("inside", "outside")}

    def offloading(flows, outside):
        # Four tries a second apart: a worker's sweep may take two seconds
        # to hand a flow back, and its frames are lost meanwhile.
        echoes(4, tries=4)
        o = offloaded()
        return o["flows"] == flows and o["egress"] == {"inside": True, "outside": outside}

    echoes(16)
    got, _ = wait_for(lambda: offloading(2, True), 3.0)
    assert got, f"a UDP echo flow should be offloaded both ways: {offloaded()}"
    assert egress() == {"inside": 1, "outside": 1}, egress()
    try:
        gro_on_peer("nx-nat-out", "off")
        got, waited = wait_for(lambda: offloading(1, False), 3.0)
        assert got and waited <= 3.0, f"{waited:.1f} s after GRO went off on nx-nat-out, still {offloaded()}"
        assert egress() == {"inside": 1, "outside": 0}, egress()
        assert offloaded()["returned"]["egress"] >= 1, f"the flow out of nx-nat-out goes back for its egress: {offloaded()['returned']}"
        echoes(40, tries=1)
    finally:
        gro_on_peer("nx-nat-out", "on")
    got, back = wait_for(lambda: offloading(2, True), 3.0)
    assert got, f"with GRO on again, the flow is not offloaded both ways: {offloaded()}"
    print(f"handed back within {waited:.1f} s, offloaded again within {back:.1f} s; {sent} echoes")


def test_af_packet_has_no_offload(lab, natrix, agent, servers, tmp_path):
    """`io = "af_packet"`: `offload = true` is refused ("offload = true
    needs AF_XDP"); with the default "auto" natrix starts without a word of
    the offload and forwards with nothing offloaded."""
    out = refused(lab, tmp_path, {"io": "af_packet", "offload": True}, "af-packet-true")
    assert "offload = true needs AF_XDP" in out, out
    print(f"refusal: {[line for line in out.splitlines() if 'offload' in line]}")
    n = natrix({"io": "af_packet"})
    assert "offload:" not in n.err.text(), f"\"auto\" with AF_PACKET should be silently off:\n{n.output()}"
    sub = agent(NS_SUB1)
    sid = sub.udp_open()
    for i in range(16):
        sub.echo(sid, (SRV1, h.UDP_ECHO), f"af-packet-{i:04d}".ljust(UDP_SIZE, "x"))
    time.sleep(1.2)
    zero = {"flows": 0, "table_full": 0, "to_inside": 0, "to_outside": 0, "egress": {"inside": False, "outside": False}, "returned": NONE_RETURNED}
    assert stats().get("offloaded", zero) == zero, stats()


def test_xdp_mode_with_af_packet_is_said_to_be_unused(natrix, agent, servers):
    """`xdp_mode` says where AF_XDP's programs run: with `io = "af_packet"`
    natrix says at start that it does not use it, and forwards."""
    n = natrix({"io": "af_packet", "xdp_mode": "native"})
    said = "xdp_mode applies to AF_XDP only: with af_packet it is not used"
    assert said in n.err.text(), f"natrix should say {said!r}:\n{n.output()}"
    sub = agent(NS_SUB1)
    sid = sub.udp_open()
    seen = {sub.echo(sid, (SRV1, h.UDP_ECHO), f"af-packet-mode-{i:04d}".ljust(UDP_SIZE, "x")) for i in range(4)}
    assert len(seen) == 1 and h.in_pool(next(iter(seen))[0], n.pool), f"the server saw the flow from {seen}"
