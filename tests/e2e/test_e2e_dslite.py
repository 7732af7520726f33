"""DS-Lite (RFC 6333) through a live natrix, judged by real stacks: two
homes, nx-sub1 and nx-sub2, each behind a user-space B4 (b4_softwire.py:
a TUN device whose IPv4 goes to the AFTR in IPv4-in-IPv6 over a raw
socket, this kernel having no ip6tnl), both using the same private address
192.0.0.2, run ping, curl and UDP to the IPv4 servers at the same time.

natrix's AFTR address is 2001:db8:1::af, on the inside link beside its
address6 2001:db8:1::1: the B4s' kernels find it with Neighbor Discovery,
which natrix answers, and natrix finds the B4s (2001:db8:1::2 and ::3, the
lab's IPv6 addresses of the homes) the same way.
"""

import json
import select
import subprocess
import threading
from pathlib import Path

import pytest

import e2e_harness as h
from e2e_harness import NS_SUB1, NS_SUB2, SRV1
from test_e2e_router import HTTP_PORT, http_server  # noqa: F401 (http_server is a fixture)

h.skip_module_if_unavailable()

AFTR = "2001:db8:1::af"
HOMES = (NS_SUB1, NS_SUB2)
B4_SCRIPT = Path(__file__).resolve().parent / "b4_softwire.py"
LAB_GATEWAY = "100.64.0.1"


@pytest.fixture
def aftr(natrix):
    return natrix({"dslite": {"aftr": AFTR}})


@pytest.fixture
def homes(aftr):
    """A B4 in each home; the homes' IPv4 default route goes into the
    softwire while it runs and back to the lab's gateway afterwards."""
    procs = []
    try:
        for ns in HOMES:
            p = subprocess.Popen(h.netns_cmd(ns, "python3", str(B4_SCRIPT), "--aftr", AFTR),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=h.clean_env())
            procs.append(p)
            ready, _, _ = select.select([p.stdout], [], [], 10)
            line = p.stdout.readline() if ready else ""
            assert line.strip() == "ready", f"the B4 in {ns} did not start: {line!r} {p.stderr.read() if p.poll() is not None else ''}"
        yield aftr
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for ns in HOMES:
            h.run_in(ns, "ip", "route", "replace", "default", "via", LAB_GATEWAY)


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
