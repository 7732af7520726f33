"""Every receive queue used (issue #24 item 3): with `io = "af_xdp"` and
`workers = 2` on interfaces that have two receive queues each, natrix runs
per-queue workers, each serving queue q (q % workers == worker) of both
interfaces; with one queue per interface the first worker owns both.
And `prefer_busy_poll`: natrix's devices defer their receive work to it
where every worker polls queues of its own (one worker, or per-queue
workers; the default, `"auto"`) or where asked, never where told not to,
and get their settings back when it stops.

The shared lab's veths have one queue, so this module builds topologies of
its own, named nxq-*, nxq1-* and nxqt-* so that they never meet `natrix lab`'s nx-*:

    nxq-cli (100.64.0.2-.5) --veth-- nxq-nat (natrix) --veth-- nxq-srv (198.51.100.11, .12)
            eth0          nxq-in                  nxq-out        eth0

every veth end with two transmit and two receive queues (nxq1-*, nxqt-*: one).
A veth delivers a frame on the peer's receive queue numbered as the
sender's transmit queue, which the sender picks by flow hash, so many flows
reach natrix on both queues, in both directions.

Judged by the kernels: the server's sockets report the external endpoint
each datagram and connection came from, the clients' sockets what came
back, the kernel's veth counters how many frames reached natrix, and
/proc which CPUs natrix's worker threads may run on. natrix's own
`worker_received_frames_total` is what is under test in
`test_every_worker_receives_from_its_own_queues`.

Needs root, AF_XDP and ethtool; what runs in the namespaces is natrix and
Python scripts on the standard library. About 5 s.
"""

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import e2e_harness as h

h.skip_module_if_unavailable()

SUBSCRIBERS = ["100.64.0.2", "100.64.0.3", "100.64.0.4", "100.64.0.5"]
SERVERS = ["198.51.100.11", "198.51.100.12"]
POOL = "203.0.113.0/28"
UDP_PORT = 7000
TCP_PORT = 7100
WORKERS = 2
API = "127.0.0.1:9300"
# Distinct client ports per test, so no test meets another's mappings.
UDP_BASE, UDP_BASE_SINGLE = 21000, 23000
# Subscribers of the hairpin test: eight, so that both workers own some.
HAIRPIN_SUBSCRIBERS = [f"100.64.1.{i}" for i in range(1, 9)]
HAIRPIN_PORT = 25000
PORTS_PER_SUBSCRIBER = 16
TCP_STREAMS = 4
TCP_BYTES = 2 * 1024 * 1024
NO_AF_XDP = h.af_xdp_unavailable()
pytestmark = [
    pytest.mark.skipif(shutil.which("ethtool") is None, reason="needs ethtool (apt-get install ethtool)"),
    pytest.mark.skipif(NO_AF_XDP is not None, reason=f"natrix's per-queue workers need AF_XDP: {NO_AF_XDP}"),
]


sh = h.sh


class Topology:
    """Client, natrix and server namespaces named PREFIX-cli, -nat, -srv,
    joined by veths with `queues` transmit and receive queues on both ends."""

    def __init__(self, prefix, queues):
        self.queues = queues
        self.cli, self.nat, self.srv = (f"{prefix}-{role}" for role in ("cli", "nat", "srv"))

    def build(self):
        self.teardown()
        for ns in (self.cli, self.nat, self.srv):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        for ns in (self.cli, self.srv):
            # No IPv6 chatter (MLD, router solicitations): every frame
            # natrix receives is one the tests sent or ARP.
            for conf in ("all", "default"):
                sh("sysctl", "-qw", f"net.ipv6.conf.{conf}.disable_ipv6=1", ns=ns)
        self.veth(self.cli, "eth0", self.nat, "nxq-in")
        self.veth(self.nat, "nxq-out", self.srv, "eth0")
        for addr in SUBSCRIBERS + HAIRPIN_SUBSCRIBERS:
            sh("ip", "addr", "add", f"{addr}/10", "dev", "eth0", ns=self.cli)
        sh("ip", "route", "add", "default", "via", "100.64.0.1", ns=self.cli)
        for addr in SERVERS:
            sh("ip", "addr", "add", f"{addr}/24", "dev", "eth0", ns=self.srv)
        sh("ip", "route", "add", POOL, "via", "198.51.100.1", ns=self.srv)

    def veth(self, a_ns, a_if, b_ns, b_if):
        q = ("numtxqueues", self.queues, "numrxqueues", self.queues)
        sh("ip", "link", "add", a_if, "netns", a_ns, *q, "type", "veth", "peer", "name", b_if, "netns", b_ns, *q)
        for ns, dev in ((a_ns, a_if), (b_ns, b_if)):
            # Offloads off, as the lab does and real NICs deliver frames: partial
            # checksums would cost natrix a sum per frame (README, "Offloads").
            sh("ethtool", "-K", dev, "rx", "off", "tx", "off", "tso", "off", "gso", "off", "gro", "off", ns=ns, check=False)
            sh("ip", "link", "set", dev, "up", ns=ns)

    def teardown(self):
        for ns in (self.cli, self.nat, self.srv):
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)

    def config(self):
        return {
            "workers": WORKERS,
            "io": "af_xdp",
            "inside": {"interface": "nxq-in", "address": "100.64.0.1/10"},
            "outside": {"interface": "nxq-out", "address": "198.51.100.1/24", "gateway": SERVERS[0]},
            "nat": {"pool": [POOL]},
            "management": {"listen": API},
        }

    def tx_frames(self):
        """Frames the client and the server have sent towards natrix, by
        their kernels' counts."""
        total = 0
        for ns in (self.cli, self.srv):
            link = json.loads(sh("ip", "-j", "-s", "link", "show", "dev", "eth0", ns=ns).stdout)[0]
            total += link["stats64"]["tx"]["packets"]
        return total


# A UDP echo server per address: replies {"peer": [ip, port], "data": ...}
# with the source address and port its socket saw, from the address the
# datagram was sent to.
UDP_ECHO = r"""
import json, socket, sys, threading
def serve(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, int(sys.argv[1])))
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(json.dumps({"peer": list(peer), "data": data.decode()}).encode(), peer)
for addr in sys.argv[2:]:
    threading.Thread(target=serve, args=(addr,), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""

# Sends one datagram from every (subscriber, port) socket to every echo
# server, `rounds` times over; resends what got no answer (twice at most).
# Prints {"answers": {"SUB:PORT/DEST/ROUND": {"seen": [ip, port], "from": [ip, port],
# "socket": "SUB:PORT"}}, "wanted": [every SUB:PORT/DEST/ROUND sent]}.
UDP_FLOWS = r"""
import json, select, socket, sys, time
subs, base, per_sub, rounds, port = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dests = [(d, port) for d in json.loads(sys.argv[6])]
socks = {}
for sub in subs:
    for p in range(base, base + per_sub):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((sub, p))
        s.setblocking(False)
        socks[f"{sub}:{p}"] = s
owner = {s.fileno(): name for name, s in socks.items()}
answers, wanted = {}, []
for r in range(rounds):
    want = [f"{name}/{d}/{r}" for name in socks for d in range(len(dests))]
    wanted += want
    for attempt in range(3):
        missing = [k for k in want if k not in answers]
        if not missing:
            break
        for k in missing:
            name, d, _ = k.split("/")
            socks[name].sendto(k.encode(), dests[int(d)])
        deadline = time.monotonic() + (2.0 if attempt == 0 else 1.0)
        while time.monotonic() < deadline and any(k not in answers for k in want):
            ready, _, _ = select.select(list(socks.values()), [], [], max(0.0, deadline - time.monotonic()))
            for s in ready:
                data, src = s.recvfrom(2048)
                reply = json.loads(data)
                answers[reply["data"]] = {"seen": reply["peer"], "from": list(src), "socket": owner[s.fileno()]}
print(json.dumps({"answers": answers, "wanted": wanted}))
"""

# One socket per subscriber learns its external endpoint from the echo
# server, then every subscriber sends to every other's external endpoint
# (RFC 4787 section 6, hairpinning). Prints {"external": {sub: [ip, port]},
# "hairpins": {"A>B": [ip, port] the datagram reached B from, or null}}.
HAIRPINS = r"""
import json, select, socket, sys, time
subs, port, server = json.loads(sys.argv[1]), int(sys.argv[2]), (sys.argv[3], int(sys.argv[4]))
socks = {}
for sub in subs:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sub, port))
    s.settimeout(2.0)
    socks[sub] = s
external = {}
for sub, s in socks.items():
    for _ in range(3):
        s.sendto(b"learn", server)
        try:
            external[sub] = json.loads(s.recvfrom(2048)[0])["peer"]
            break
        except socket.timeout:
            pass
hairpins = {}
for a in subs:
    for b in subs:
        if a == b or a not in external or b not in external:
            continue
        key = f"{a}>{b}"
        socks[a].sendto(key.encode(), tuple(external[b]))
        hairpins[key] = None
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                data, src = socks[b].recvfrom(2048)
            except socket.timeout:
                break
            if data.decode() == key:
                hairpins[key] = list(src)
                break
print(json.dumps({"external": external, "hairpins": hairpins}))
"""

# A TCP server that echoes each connection's bytes back and, at its end,
# prints {"peer": [ip, port], "bytes": N, "sha256": HEX} for it.
TCP_ECHO = r"""
import hashlib, json, socket, sys, threading
lock = threading.Lock()
def serve(conn, peer):
    digest, n = hashlib.sha256(), 0
    while True:
        data = conn.recv(65536)
        if not data:
            break
        digest.update(data)
        n += len(data)
        conn.sendall(data)
    conn.close()
    with lock:
        print(json.dumps({"peer": list(peer), "bytes": n, "sha256": digest.hexdigest()}), flush=True)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(64)
print("listening", flush=True)
while True:
    conn, peer = s.accept()
    threading.Thread(target=serve, args=(conn, peer), daemon=True).start()
"""

# Opens `streams` TCP connections at once, each sending `size` random bytes
# and reading the echo until the server closes; prints one JSON list of
# {"local": [ip, port], "sent_sha256", "received": N, "received_sha256"}.
TCP_STREAMS_CLIENT = r"""
import hashlib, json, os, socket, sys, threading
server, port, streams, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
results = [None] * streams
def stream(i):
    payload = os.urandom(size)
    s = socket.create_connection((server, port), timeout=20)
    def send():
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
    sender = threading.Thread(target=send)
    sender.start()
    digest, n = hashlib.sha256(), 0
    while True:
        data = s.recv(65536)
        if not data:
            break
        digest.update(data)
        n += len(data)
    sender.join()
    results[i] = {"local": list(s.getsockname()), "sent_sha256": hashlib.sha256(payload).hexdigest(),
                  "received": n, "received_sha256": digest.hexdigest()}
    s.close()
threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(results))
"""


class Service:
    """A Python script running in a namespace, its stdout lines collected."""

    def __init__(self, ns, script, *args):
        self.proc = subprocess.Popen(h.netns_cmd(ns, sys.executable, "-u", "-c", script, *args),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=h.clean_env())
        self.out = h._Lines(self.proc.stdout)
        self.err = h._Lines(self.proc.stderr)
        deadline = time.monotonic() + 10
        while "listening" not in self.out.text():
            assert self.proc.poll() is None and time.monotonic() < deadline, f"server in {ns} did not start: {self.err.text()}"
            time.sleep(0.05)

    def stop(self):
        self.proc.kill()
        self.proc.wait(timeout=5)


class Setup:
    """A topology with natrix and the servers running in it."""

    def __init__(self, topo, natrix, tcp):
        self.topo, self.natrix, self.tcp = topo, natrix, tcp

    def metrics(self):
        """natrix's /metrics as {(name, ((label, value), ...)): value}."""
        text = self.api_get("/metrics")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}

    def received_frames(self):
        """worker_received_frames_total by worker."""
        return {int(dict(labels)["worker"]): v for (name, labels), v in self.metrics().items() if name == "natrix_worker_received_frames_total"}

    def api_get(self, path):
        code = f"import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://{API}{path}', timeout=5).read().decode())"
        p = sh(sys.executable, "-c", code, ns=self.topo.nat, check=False)
        assert p.returncode == 0, f"GET {path} from natrix's API: {p.stderr}\n{self.natrix.output()}"
        return p.stdout

    def udp_flows(self, base, per_sub, rounds):
        """Runs UDP_FLOWS from ports base.. of every subscriber and checks
        the echoes; returns {"SUB:PORT": external endpoint}."""
        p = sh(sys.executable, "-c", UDP_FLOWS, json.dumps(SUBSCRIBERS), base, per_sub, rounds, UDP_PORT, json.dumps(SERVERS), ns=self.topo.cli, timeout=30)
        result = json.loads(p.stdout)
        assert len(result["wanted"]) == len(SUBSCRIBERS) * per_sub * len(SERVERS) * rounds, "the client sent fewer datagrams than planned"
        return check_echoes(result)

    def startup_notes(self):
        return self.natrix.err.text().splitlines()


def start(topo, tmp, **settings):
    """Builds `topo`, starts natrix and the servers in it; a generator for
    module fixtures, which tears everything down whatever happened."""
    problem = h.setup_problem()
    if problem:
        pytest.fail(problem)
    natrix, services = None, []
    try:
        topo.build()
        services.append(Service(topo.srv, UDP_ECHO, UDP_PORT, *SERVERS))
        services.append(Service(topo.srv, TCP_ECHO, TCP_PORT))
        natrix = h.Natrix({**topo.config(), **settings}, tmp / f"{topo.nat}.toml", ns=topo.nat)
        natrix.wait_ready()
        yield Setup(topo, natrix, tcp=services[1])
    finally:
        rc = natrix.stop() if natrix else 0
        for s in services:
            s.stop()
        topo.teardown()
    assert rc == 0, f"natrix exited with status {rc} on SIGTERM (expected 0)\n{natrix.output()}"


@pytest.fixture(scope="module")
def multiqueue(tmp_path_factory):
    yield from start(Topology("nxq", queues=2), tmp_path_factory.mktemp("queues"))


@pytest.fixture(scope="module")
def single_queue(tmp_path_factory):
    yield from start(Topology("nxq1", queues=1), tmp_path_factory.mktemp("queues1"))


def served_queues(notes):
    """{(worker, interface): [queue, ...]} from the start-up notes."""
    served = {}
    for line in notes:
        m = re.search(r"worker (\d+) serves receive queues \[([\d, ]*)\] of (\S+) and \[([\d, ]*)\] of (\S+)", line)
        if m:
            w = int(m.group(1))
            served[(w, m.group(3))] = [int(q) for q in m.group(2).split(",") if q.strip()]
            served[(w, m.group(5))] = [int(q) for q in m.group(4).split(",") if q.strip()]
    return served


def thread_cpus(pid):
    """{thread name: allowed CPUs} of process `pid`, from /proc."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = (task / "comm").read_text().strip()
        allowed = re.search(r"^Cpus_allowed_list:\s*(\S+)", (task / "status").read_text(), re.M).group(1)
        out[name] = allowed
    return out


def check_echoes(result):
    """The checks every UDP exchange must pass; returns {socket: external endpoint}."""
    answers = result["answers"]
    missing = sorted(set(result["wanted"]) - set(answers))
    assert not missing, f"{len(missing)} of {len(result['wanted'])} datagrams got no echo after 3 tries: {missing[:8]}"
    external = {}
    for key, a in answers.items():
        name, dest, _ = key.split("/")
        assert a["socket"] == name, f"the echo of {key} reached socket {a['socket']}: inbound translation to the wrong internal endpoint"
        assert tuple(a["from"]) == (SERVERS[int(dest)], UDP_PORT), f"the echo of {key} came from {a['from']}, not the server it was sent to"
        seen = tuple(a["seen"])
        assert ipaddress.ip_address(seen[0]) in ipaddress.ip_network(POOL), f"{name} reached the server as {seen}, outside the pool {POOL}"
        # RFC 4787 REQ-1: one internal endpoint, one external endpoint, whatever the destination.
        assert external.setdefault(name, seen) == seen, f"{name} reached the servers as {external[name]} and as {seen} ({key}): not endpoint-independent"
    by_endpoint = {}
    for name, seen in external.items():
        assert by_endpoint.setdefault(seen, name) == name, f"{name} and {by_endpoint[seen]} share the external endpoint {seen}"
    for sub in SUBSCRIBERS:
        # RFC 4787 REQ-2: paired pooling, one external address per subscriber.
        addrs = {seen[0] for name, seen in external.items() if name.startswith(sub + ":")}
        assert len(addrs) == 1, f"subscriber {sub} left from several pool addresses {addrs}: not paired"
    return external


def test_natrix_announces_a_worker_per_receive_queue(multiqueue):
    notes = multiqueue.startup_notes()
    text = "\n".join(notes)
    served = served_queues(notes)
    for iface in ("nxq-in", "nxq-out"):
        by_queue = sorted(q for w in range(WORKERS) for q in served.get((w, iface), []))
        assert by_queue == [0, 1], f"{iface}'s receive queues 0 and 1 should each have one worker: {served}\n{text}"
        for w in range(WORKERS):
            assert served.get((w, iface)) == [w], f"worker {w} should serve queue {w} of {iface} (q % workers): {served}\n{text}"
    pinned = re.search(r"2 per-queue workers, pinned to CPUs \[(\d+), (\d+)\]", text)
    assert pinned or re.search(r"2 per-queue workers, not pinned", text), f"no per-queue workers note:\n{text}"
    assert "natrix: ready: forwarding between nxq-in and nxq-out (af_xdp, 2 workers)" in multiqueue.natrix.out.text()
    if pinned:
        # The kernel's view of the pinning: each worker thread may run on its CPU only.
        cpus = thread_cpus(multiqueue.natrix.proc.pid)
        for w in range(WORKERS):
            assert cpus.get(f"natrix-w{w}") == pinned.group(w + 1), f"natrix-w{w} may run on {cpus.get(f'natrix-w{w}')}, not CPU {pinned.group(w + 1)}: {cpus}"


def test_many_udp_flows_are_translated_whatever_queue_carries_them(multiqueue):
    """64 internal endpoints (4 subscribers x 16 ports), each sending to two
    servers twice: every datagram is echoed to the socket that sent it,
    from the server it went to, and each internal endpoint has one
    external endpoint in the pool for both servers (RFC 4787 REQ-1)."""
    external = multiqueue.udp_flows(UDP_BASE, PORTS_PER_SUBSCRIBER, rounds=2)
    assert len(external) == len(SUBSCRIBERS) * PORTS_PER_SUBSCRIBER


def test_parallel_tcp_streams_arrive_whole(multiqueue):
    """4 TCP connections at once, each 2 MiB echoed back: the server gets
    every byte from a pool address, the client gets every byte back."""
    p = sh(sys.executable, "-c", TCP_STREAMS_CLIENT, SERVERS[0], TCP_PORT, TCP_STREAMS, TCP_BYTES, ns=multiqueue.topo.cli, check=False, timeout=40)
    assert p.returncode == 0, f"TCP streams failed: {p.stderr[-2000:]}\n{multiqueue.natrix.output()}"
    streams = json.loads(p.stdout)
    for s in streams:
        assert s["received"] == TCP_BYTES and s["received_sha256"] == s["sent_sha256"], f"stream from {s['local']} got {s['received']} of {TCP_BYTES} bytes back, or other bytes"
    deadline = time.monotonic() + 5
    while len(multiqueue.tcp.out.text().splitlines()) < 1 + TCP_STREAMS and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = [json.loads(line) for line in multiqueue.tcp.out.text().splitlines()[1:]]
    assert len(seen) == TCP_STREAMS, f"the server saw {len(seen)} connections end, not {TCP_STREAMS}: {seen}"
    assert sorted(c["sha256"] for c in seen) == sorted(s["sent_sha256"] for s in streams), f"the server received other bytes than were sent: {seen}"
    assert all(c["bytes"] == TCP_BYTES for c in seen), seen
    for c in seen:
        assert ipaddress.ip_address(c["peer"][0]) in ipaddress.ip_network(POOL), f"a connection reached the server from {c['peer']}, outside the pool"
    assert len({tuple(c["peer"]) for c in seen}) == TCP_STREAMS, f"connections shared an external endpoint: {seen}"


def test_per_queue_workers_have_their_devices_defer_by_default(multiqueue):
    """Without `prefer_busy_poll`, per-queue workers have the devices defer
    their receive work to the workers' polls, and say so."""
    assert napi_settings(multiqueue.topo) == {"nxq-in": ("10", "100000"), "nxq-out": ("10", "100000")}
    notes = "\n".join(multiqueue.startup_notes())
    for dev in ("nxq-in", "nxq-out"):
        want = f"{dev}: napi_defer_hard_irqs 10 and gro_flush_timeout 100000 ns while natrix runs, so its polls run the device's receive work (prefer_busy_poll = \"auto\", per-queue workers)"
        assert want in notes, notes


def test_hairpins_between_subscribers_of_either_worker(multiqueue):
    """RFC 4787 REQ-9 across per-queue workers: every subscriber reaches
    every other at its external endpoint, and arrives from its own
    external endpoint, also when the two are owned by different workers
    (the frame leaves the sender's worker translated and is handed to the
    receiver's as inbound). Both workers gain sessions, so some pairs
    cross between them."""
    sessions = lambda: [w["sessions"] for w in json.loads(multiqueue.api_get("/api/stats"))["per_worker"]]
    before = sessions()
    p = sh(sys.executable, "-c", HAIRPINS, json.dumps(HAIRPIN_SUBSCRIBERS), HAIRPIN_PORT, SERVERS[0], UDP_PORT, ns=multiqueue.topo.cli, timeout=200)
    result = json.loads(p.stdout)
    after = sessions()
    assert sorted(result["external"]) == sorted(HAIRPIN_SUBSCRIBERS), f"some subscribers never learned their external endpoint: {result['external']}"
    assert all(a > b for a, b in zip(after, before)), f"the eight subscribers did not span both workers (sessions {before} -> {after}): no pair crossed"
    for key, src in result["hairpins"].items():
        a, b = key.split(">")
        assert src is not None, f"{a}'s datagram to {b}'s external endpoint {result['external'][b]} never arrived"
        assert src == result["external"][a], f"{b} got {a}'s hairpinned datagram from {src}, not from {a}'s external endpoint {result['external'][a]}"


def test_every_worker_receives_from_its_own_queues(multiqueue):
    """Both workers take frames from their own queues, and together they
    took at least every frame the client and the server sent natrix
    meanwhile (by the kernels' veth counters)."""
    before, tx_before = multiqueue.received_frames(), multiqueue.topo.tx_frames()
    multiqueue.udp_flows(UDP_BASE + 100, PORTS_PER_SUBSCRIBER, rounds=1)
    time.sleep(0.3)
    tx = multiqueue.topo.tx_frames() - tx_before
    after = multiqueue.received_frames()
    assert sorted(after) == list(range(WORKERS)), f"worker_received_frames_total should have one sample per worker: {after}"
    got = {w: after[w] - before.get(w, 0) for w in after}
    for w in range(WORKERS):
        assert got[w] > 0, f"worker {w} received no frames from its queues while {tx} frames reached natrix: {got}"
    assert sum(got.values()) >= tx, f"the workers received {sum(got.values())} frames ({got}), fewer than the {tx} the client and server sent"
    per_worker = json.loads(multiqueue.api_get("/api/stats"))["per_worker"]
    assert all(per_worker[w]["received_frames"] >= after[w] > 0 for w in range(WORKERS)), per_worker


def test_one_queue_each_leaves_the_interfaces_to_the_first_worker(single_queue):
    """`workers = 2` on single-queue veths: no per-queue workers; traffic
    still flows, and worker 1 takes no frames from any queue. By default
    the devices are left alone: the first worker serves every queue for
    both, and the devices' NAPI threads may use the other's CPU."""
    text = "\n".join(single_queue.startup_notes())
    assert "serves receive queues" not in text and "per-queue workers, " not in text, f"per-queue workers on single-queue interfaces:\n{text}"
    assert "per-queue workers need 2 on each, so worker 0 serves every queue" in text, f"natrix does not say why it runs no per-queue workers:\n{text}"
    assert "natrix: ready: forwarding between nxq-in and nxq-out (af_xdp, 2 workers)" in single_queue.natrix.out.text()
    assert napi_settings(single_queue.topo) == {"nxq-in": ("0", "0"), "nxq-out": ("0", "0")}, "two workers on one set of queues leave the devices alone by default"
    assert "napi_defer_hard_irqs" not in text, text
    before, tx_before = single_queue.received_frames(), single_queue.topo.tx_frames()
    single_queue.udp_flows(UDP_BASE_SINGLE, 4, rounds=2)
    time.sleep(0.3)
    tx = single_queue.topo.tx_frames() - tx_before
    after = single_queue.received_frames()
    assert after[1] == 0, f"worker 1 serves no queue, yet received {after[1]} frames"
    assert after[0] - before.get(0, 0) >= tx, f"worker 0 received {after[0] - before.get(0, 0)} frames, fewer than the {tx} sent to natrix"


def test_generic_programs_on_veth_leave_every_frame_to_the_first_worker(tmp_path):
    """README, "XDP mode": veth records no receive queue for the frames it
    hands its stack, and a generic XDP program (`xdp_mode = "generic"`)
    then sees the peer's transmit queue less one: on veths of two queues
    every frame reaches queue 0. natrix says so at start for both
    interfaces; every flow is still translated (worker 0 hands the other
    worker its frames), and worker 1 takes none from its own queues."""
    with natrix_in(Topology("nxqg", queues=2), tmp_path, xdp_mode="generic") as s:
        text = "\n".join(s.startup_notes())
        assert "XDP programs in generic mode on nxq-in and nxq-out" in text, text
        for dev in ("nxq-in", "nxq-out"):
            assert f"{dev} is a veth: with generic XDP programs a frame its peer sent on transmit queue q reaches receive queue q - 1" in text, f"no note for {dev}:\n{text}"
            assert "so queue 1 receives none and queue 0 twice its share" in text, text
        before, tx_before = s.received_frames(), s.topo.tx_frames()
        s.udp_flows(UDP_BASE, PORTS_PER_SUBSCRIBER, rounds=1)
        time.sleep(0.3)
        tx = s.topo.tx_frames() - tx_before
        after = s.received_frames()
        got = {w: after[w] - before.get(w, 0) for w in after}
        assert got.get(1) == 0, f"worker 1 received frames from its own queue with generic programs on veth: {got}"
        assert got.get(0, 0) >= tx, f"worker 0 received {got.get(0)} frames, fewer than the {tx} the client and server sent"


def napi_settings(topo):
    """(napi_defer_hard_irqs, gro_flush_timeout) of natrix's two interfaces."""
    if not os.path.exists("/sys/class/net/lo/napi_defer_hard_irqs"):
        pytest.skip("this kernel has no napi_defer_hard_irqs (Linux 5.11 added it)")
    read = lambda dev, s: sh("cat", f"/sys/class/net/{dev}/{s}", ns=topo.nat).stdout.strip()
    return {dev: (read(dev, "napi_defer_hard_irqs"), read(dev, "gro_flush_timeout")) for dev in ("nxq-in", "nxq-out")}


@contextlib.contextmanager
def natrix_in(topo, tmp, **settings):
    """`topo` built and natrix running in it for one test, torn down after."""
    setup = start(topo, tmp, **settings)
    try:
        yield next(setup)
    finally:
        setup.close()


def test_devices_defer_their_receive_work_to_natrix_while_it_runs(tmp_path):
    """`prefer_busy_poll = true`: while natrix runs, its AF_XDP interfaces
    defer their receive work (napi_defer_hard_irqs 10, gro_flush_timeout
    100 us, as the kernel's preferred busy polling wants), also for two
    workers on one set of queues, and the zeros they had come back when
    natrix stops; traffic flows meanwhile."""
    topo = Topology("nxqt", queues=1)
    with natrix_in(topo, tmp_path, prefer_busy_poll=True) as running:
        assert napi_settings(topo) == {"nxq-in": ("10", "100000"), "nxq-out": ("10", "100000")}, running.natrix.output()
        notes = "\n".join(running.startup_notes())
        assert "nxq-in: napi_defer_hard_irqs 10 and gro_flush_timeout 100000 ns while natrix runs" in notes, notes
        running.udp_flows(UDP_BASE_SINGLE, 2, rounds=1)
        assert running.natrix.stop() == 0, running.natrix.output()
        assert napi_settings(topo) == {"nxq-in": ("0", "0"), "nxq-out": ("0", "0")}, "natrix put back what it changed"


def test_one_worker_has_its_devices_defer_by_default(tmp_path):
    """Without `prefer_busy_poll`, one worker polls every queue itself, so
    its devices defer their receive work to it, and natrix says why."""
    topo = Topology("nxqt", queues=1)
    with natrix_in(topo, tmp_path, workers=1) as running:
        assert napi_settings(topo) == {"nxq-in": ("10", "100000"), "nxq-out": ("10", "100000")}, running.natrix.output()
        notes = "\n".join(running.startup_notes())
        assert "nxq-in: napi_defer_hard_irqs 10 and gro_flush_timeout 100000 ns while natrix runs, so its polls run the device's receive work (prefer_busy_poll = \"auto\", one worker)" in notes, notes
        running.udp_flows(UDP_BASE_SINGLE, 2, rounds=1)


def test_devices_are_left_alone_when_told(tmp_path):
    """`prefer_busy_poll = false`: per-queue workers run, and the devices'
    settings stay as they were."""
    topo = Topology("nxqt", queues=2)
    with natrix_in(topo, tmp_path, prefer_busy_poll=False) as running:
        notes = "\n".join(running.startup_notes())
        assert "2 per-queue workers" in notes, notes
        assert napi_settings(topo) == {"nxq-in": ("0", "0"), "nxq-out": ("0", "0")}, running.natrix.output()
        assert "napi_defer_hard_irqs" not in notes, notes
        running.udp_flows(UDP_BASE_SINGLE, 2, rounds=1)
