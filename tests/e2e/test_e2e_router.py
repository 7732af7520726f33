"""Router mode (`[nat] mode = "off"`) and IPv6 routing through a live natrix,
judged by the kernel's own tools in the subscriber and server namespaces:
ping, curl and traceroute (issue 17 item 6).

Written from CONTRACTS.md ("Wave 2: shared rules") and the README: in router
mode natrix forwards IPv4 and IPv6 between its interfaces without
translating, decrements TTL and hop limit, and answers an exhausted one with
ICMP / ICMPv6 time exceeded from the address of the side the error leaves on;
IPv6 that nothing else claims is routed in every mode, NAPT44 included.

The lab (`natrix lab up`) gives the hosts IPv6 (subscribers 2001:db8:1::2 and
::3, servers 2001:db8:2::11..13) and natrix `address6` on both sides. In
router mode the servers need a route back to the subscribers' own 100.64.0.0/10
addresses; the `router` fixture adds it for the test and removes it after.
"""

import json
import re
import select
import shutil
import subprocess

import pytest

import e2e_harness as h
from e2e_harness import NS_SRV1, NS_SUB1, SRV1, SUB1

h.skip_module_if_unavailable()

# The lab's IPv6 plan (`natrix lab up`).
SUB1_6 = "2001:db8:1::2"
SRV1_6 = "2001:db8:2::11"
NAT_INSIDE = "100.64.0.1"
NAT_INSIDE6 = "2001:db8:1::1"

# The HTTP server of this module; not 8080, which the agents' servers use.
HTTP_PORT = 8086

# What each tool is called and which Debian package brings it.
PACKAGES = {"ping": "iputils-ping", "curl": "curl", "traceroute": "traceroute"}

# A tiny HTTP server for nx-srv1: one listener per address given, each GET
# answered with the client address it saw as JSON. "listening" once bound;
# it stops when its stdin closes. server_bind is TCPServer's, so no reverse
# DNS look-up of the bind address delays the start.
HTTP_SERVER = r"""
import http.server, json, socket, socketserver, sys, threading

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"peer": self.client_address[0]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

def server(addr, port):
    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        allow_reuse_address = True
        daemon_threads = True

        def server_bind(self):
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = addr, port

    return Server((addr, port), Handler)

port = int(sys.argv[1])
for s in [server(a, port) for a in sys.argv[2:]]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("listening", flush=True)
sys.stdin.read()
"""


def need(*tools):
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pkgs = " ".join(PACKAGES.get(t, t) for t in missing)
        pytest.skip(f"{', '.join(missing)} not installed here (apt-get install -y {pkgs})")


@pytest.fixture(scope="module")
def http_server(lab):
    """The HTTP server in nx-srv1 on SRV1 and SRV1_6, port HTTP_PORT."""
    proc = subprocess.Popen(
        h.netns_cmd(NS_SRV1, "python3", "-c", HTTP_SERVER, HTTP_PORT, SRV1, SRV1_6),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=h.clean_env())
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "listening":
            proc.kill()
            pytest.fail(f"the HTTP server in {NS_SRV1} did not start: "
                        f"{line!r} {proc.stderr.read()}", pytrace=False)
        yield (SRV1, SRV1_6)
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@pytest.fixture
def router(natrix, routed_to_subscribers):
    """natrix in router mode (`[nat] mode = "off"`, no pool)."""
    return natrix(h.ROUTER_MODE)


def ping(family, dst):
    need("ping")
    argv = ["ping", "-c", "2", "-i", "0.3", "-W", "2", dst]
    if family == 6:
        argv.insert(1, "-6")
    r = h.run_in(NS_SUB1, *argv, timeout=15)
    assert r.returncode == 0, (f"`{' '.join(argv)}` from {NS_SUB1} failed "
                               f"({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def http_peer(family, host):
    """GETs the module's HTTP server from nx-sub1 with curl; returns the
    client address the server saw."""
    need("curl")
    url = f"http://[{host}]:{HTTP_PORT}/" if family == 6 else f"http://{host}:{HTTP_PORT}/"
    argv = ["curl", f"-{family}", "-g", "-sS", "--noproxy", "*", "--max-time", "5",
            "--connect-timeout", "4", url]
    r = h.run_in(NS_SUB1, *argv, timeout=15)
    assert r.returncode == 0, (f"`{' '.join(argv)}` from {NS_SUB1} failed "
                               f"({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout)["peer"]


def traceroute_hops(family, dst):
    """`traceroute -n -q 1 -m 3` (UDP probes) from nx-sub1: {hop: address}."""
    need("traceroute")
    argv = ["traceroute", "-n", "-q", "1", "-m", "3", "-w", "2", dst]
    if family == 6:
        argv.insert(1, "-6")
    r = h.run_in(NS_SUB1, *argv, timeout=30)
    assert r.returncode == 0, (f"`{' '.join(argv)}` from {NS_SUB1} failed "
                               f"({r.returncode}):\n{r.stdout}\n{r.stderr}")
    hops = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+(\S+)", line)
        if m:
            hops[int(m.group(1))] = m.group(2)
    return hops, r.stdout


# --- router mode ----------------------------------------------------------------

@pytest.mark.parametrize("family", [4, 6])
def test_router_ping(router, family):
    """ping / ping -6 from a subscriber to a server through natrix in router
    mode: the echo replies arrive with TTL / hop limit 63, one less than the
    server's 64, so natrix forwarded them as a router."""
    out = ping(family, SRV1 if family == 4 else SRV1_6)
    assert re.search(r"\b(ttl|hlim)=63\b", out), (
        f"expected replies with TTL / hop limit 63 (64 less natrix's hop):\n{out}")


@pytest.mark.parametrize("family", [4, 6])
def test_router_http_untranslated(router, http_server, family):
    """curl / curl -6 from a subscriber to a server in router mode: the
    server sees the subscriber's own address, untranslated."""
    seen = http_peer(family, SRV1 if family == 4 else SRV1_6)
    want = SUB1 if family == 4 else SUB1_6
    assert seen == want, f"the server saw {seen}, expected the subscriber's own {want}"


@pytest.mark.parametrize("family", [4, 6])
def test_router_traceroute_first_hop_is_natrix(router, family):
    """traceroute / traceroute -6 (UDP probes) from a subscriber: hop 1 is
    natrix's inside address / address6 (ICMP / ICMPv6 time exceeded from
    natrix when TTL / hop limit runs out), hop 2 the server itself."""
    dst, hop1 = (SRV1, NAT_INSIDE) if family == 4 else (SRV1_6, NAT_INSIDE6)
    hops, out = traceroute_hops(family, dst)
    assert hops.get(1) == hop1, f"hop 1 should be natrix's {hop1}:\n{out}"
    assert hops.get(2) == dst, f"hop 2 should be the server {dst}:\n{out}"


# --- IPv6 beside NAPT44 ------------------------------------------------------------

def test_napt44_routes_ipv6(natrix, http_server):
    """With the lab's NAPT44 configuration, IPv6 is routed beside it: ping -6
    and curl -6 from a subscriber reach the server, which sees the
    subscriber's own IPv6 address, while IPv4 to the same server is still
    translated to a pool address."""
    n = natrix()
    ping(6, SRV1_6)
    seen6 = http_peer(6, SRV1_6)
    assert seen6 == SUB1_6, f"over IPv6 the server saw {seen6}, expected {SUB1_6} (routed)"
    seen4 = http_peer(4, SRV1)
    assert h.in_pool(seen4, n.pool), f"over IPv4 the server saw {seen4}, not a pool address"
