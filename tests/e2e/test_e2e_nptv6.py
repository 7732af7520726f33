"""NPTv6 (RFC 6296) through a live natrix, judged by real stacks: ping -6 and
curl -6 between the lab's namespaces, and the server's own firewall
counting which source prefixes reach it.

Written from RFC 6296 and CONTRACTS.md ("NPTv6"): natrix maps the inside
host's source prefix to the outside prefix on the way out and the
destination back on the way in, statelessly, so the server sees only the
external prefix and can also reach the host first.

The lab (`natrix lab up`) is adapted for the module's length: nx-sub1 gets
the site-local address fd01:203:405:1::2/64 (the prefix of RFC 6296 section
3.6) and a default route through natrix's inside address6
fd01:203:405:1::1 with that address as its source; the servers route the
external prefix 2001:db8:1::/48 to natrix's outside address6. With the
binding fd01:203:405::/48 <-> 2001:db8:1::/48 the host's subnet word 0x0001
becomes 0xD550 (section 3.6: 0x0001 + 0xD54F) and its interface identifier
stays, so the server must see 2001:db8:1:d550::2.
"""

import ipaddress
import json
import re
import signal
import time

import pytest

import e2e_harness as h
from e2e_harness import NS_SRV1, NS_SRV2, NS_SRV3, NS_SUB1
from test_e2e_router import http_peer, http_server, ping  # noqa: F401 (http_server is a fixture)

h.skip_module_if_unavailable()

INSIDE_PREFIX, OUTSIDE_PREFIX = "fd01:203:405::/48", "2001:db8:1::/48"
HOST6 = "fd01:203:405:1::2"
NAT_INSIDE6 = "fd01:203:405:1::1"
EXTERNAL6 = "2001:db8:1:d550::2"
SRV1_6 = "2001:db8:2::11"
NAT_OUTSIDE6 = "2001:db8:2::1"
LAB_INSIDE6 = "2001:db8:1::1"
SERVERS = (NS_SRV1, NS_SRV2, NS_SRV3)
COUNTERS = "natrix_nptv6_seen"


def must(ns, *argv):
    r = h.run_in(ns, *argv)
    assert r.returncode == 0, f"{ns}: `{' '.join(map(str, argv))}` failed: {r.stderr or r.stdout}"
    return r.stdout


@pytest.fixture(scope="module")
def site(lab):
    """The host's site-local address and route, the servers' route to the
    external prefix, and a counter in nx-srv1 of IPv6 arriving from the
    site-local and from the external prefix; all removed afterwards."""
    undo = []
    try:
        must(NS_SUB1, "ip", "-6", "addr", "add", f"{HOST6}/64", "dev", "eth0", "nodad")
        undo.append((NS_SUB1, "ip", "-6", "addr", "del", f"{HOST6}/64", "dev", "eth0"))
        must(NS_SUB1, "ip", "-6", "route", "replace", "default", "via", NAT_INSIDE6, "src", HOST6)
        undo.append((NS_SUB1, "ip", "-6", "route", "replace", "default", "via", LAB_INSIDE6))
        for ns in SERVERS:
            must(ns, "ip", "-6", "route", "add", OUTSIDE_PREFIX, "via", NAT_OUTSIDE6)
            undo.append((ns, "ip", "-6", "route", "del", OUTSIDE_PREFIX, "via", NAT_OUTSIDE6))
        must(NS_SRV1, "nft", f"add table ip6 {COUNTERS}; "
                              f"add chain ip6 {COUNTERS} in {{ type filter hook prerouting priority raw; }}; "
                              f"add rule ip6 {COUNTERS} in ip6 saddr fd00::/8 counter; "
                              f"add rule ip6 {COUNTERS} in ip6 saddr {OUTSIDE_PREFIX} counter")
        undo.append((NS_SRV1, "nft", "delete", "table", "ip6", COUNTERS))
        yield
    finally:
        for argv in reversed(undo):
            h.run_in(*argv)


@pytest.fixture
def nptv6(natrix, site):
    """natrix with the lab's configuration, its inside address6 in the
    site-local prefix and the binding of RFC 6296 section 3.6. The lab's
    NAPT44 stays on for IPv4: NPTv6 works beside it."""
    return natrix({
        "inside": {"address6": f"{NAT_INSIDE6}/64"},
        "nptv6": [{"inside": INSIDE_PREFIX, "outside": OUTSIDE_PREFIX}],
    })


def seen_by_srv1():
    """(packets from fd00::/8, packets from the external prefix) that
    reached nx-srv1 so far."""
    listing = json.loads(must(NS_SRV1, "nft", "-j", "list", "table", "ip6", COUNTERS))
    counts = [e["counter"]["packets"] for item in listing["nftables"]
              for e in item.get("rule", {}).get("expr", []) if "counter" in e]
    assert len(counts) == 2, listing
    return tuple(counts)


def test_the_expected_external_address_is_rfc_6296s():
    """The address this module expects, from section 3.2's arithmetic: the
    one's-complement sums of the prefixes differ by 0xD54F."""
    def csum(prefix):
        s = sum(ipaddress.IPv6Network(prefix).network_address.packed[i] << 8 | ipaddress.IPv6Network(prefix).network_address.packed[i + 1] for i in range(0, 16, 2))
        while s >> 16:
            s = (s & 0xFFFF) + (s >> 16)
        return s
    adj = csum(INSIDE_PREFIX) + (~csum(OUTSIDE_PREFIX) & 0xFFFF)
    adj = (adj & 0xFFFF) + (adj >> 16)
    assert adj == 0xD54F
    assert ipaddress.IPv6Address(EXTERNAL6) == ipaddress.IPv6Address("2001:db8:1:d550::2")


def test_ping6_across_nptv6(nptv6):
    """ping -6 from the site-local host to the server: the echo replies come
    back (translated back to fd01:203:405:1::2) with hop limit 63."""
    out = ping(6, SRV1_6)
    assert re.search(r"\b(ttl|hlim)=63\b", out), f"expected replies with hop limit 63:\n{out}"


def test_curl6_server_sees_only_the_external_prefix(nptv6, http_server):  # noqa: F811
    """curl -6 from the host: the server sees the client as
    2001:db8:1:d550::2, and its firewall counted IPv6 from the external
    prefix and none from fd00::/8."""
    before = seen_by_srv1()
    peer = http_peer(6, SRV1_6)
    assert peer == EXTERNAL6, f"the server saw {peer}, expected {EXTERNAL6}"
    site_local, external = (a - b for a, b in zip(seen_by_srv1(), before))
    assert site_local == 0, f"{site_local} packets from fd00::/8 reached the server"
    assert external > 0, "no packet from the external prefix reached the server"


def test_server_reaches_the_host_first(nptv6):
    """Stateless and 1:1: the server can ping the host's external address
    without the host having sent anything, and the host answers."""
    r = h.run_in(NS_SRV1, "ping", "-6", "-c", "2", "-i", "0.3", "-W", "2", EXTERNAL6, timeout=15)
    assert r.returncode == 0, f"ping -6 {EXTERNAL6} from {NS_SRV1} failed:\n{r.stdout}\n{r.stderr}"


def test_metrics_count_translated_frames(nptv6):
    """`natrix_nptv6_translated_packets_total` counts what NPTv6 translated,
    by the interface it arrived on: after a ping -6 both are above zero."""
    ping(6, SRV1_6)
    r = h.run_in(h.NS_NAT, "curl", "-sS", "--noproxy", "*", "-m", "5", f"http://{h.DEFAULT_API}/metrics")
    assert r.returncode == 0, r.stderr
    counts = {}
    for line in r.stdout.splitlines():
        if line.startswith("natrix_nptv6_translated_packets_total{"):
            side = line.split('interface="')[1].split('"')[0]
            counts[side] = float(line.rsplit(" ", 1)[1])
    assert counts.get("inside", 0) > 0 and counts.get("outside", 0) > 0, r.stdout[-2000:]


def rfc6296_map(addr, from_prefix, to_prefix):
    """RFC 6296 section 3, for the reload test's /64 binding: the prefix
    replaced and the sum difference added to the first interface-identifier
    word that is not 0xFFFF (section 3.5), 0xFFFF written as 0."""
    def add(a, b):
        s = a + b
        return (s & 0xFFFF) + (s >> 16)

    def words(a):
        p = ipaddress.IPv6Address(a).packed
        return [p[i] << 8 | p[i + 1] for i in range(0, 16, 2)]

    src, dst = ipaddress.IPv6Network(from_prefix), ipaddress.IPv6Network(to_prefix)
    sum_src = sum_dst = 0
    for w in words(src.network_address):
        sum_src = add(sum_src, w)
    for w in words(dst.network_address):
        sum_dst = add(sum_dst, w)
    host = int(ipaddress.IPv6Address(addr)) & ((1 << (128 - src.prefixlen)) - 1)
    w = words(ipaddress.IPv6Address(int(dst.network_address) | host))
    i = next(i for i in range(4, 8) if w[i] != 0xFFFF)
    w[i] = add(w[i], add(sum_src, ~sum_dst & 0xFFFF))
    w[i] = 0 if w[i] == 0xFFFF else w[i]
    return str(ipaddress.IPv6Address(b"".join(x.to_bytes(2, "big") for x in w)))


def test_sighup_replaces_the_binding(nptv6, http_server):  # noqa: F811
    """A reload (SIGHUP) rebuilds the binding table: with the binding
    changed to fd01:203:405:1::/64 <-> 2001:db8:1:77::/64, the server sees
    the host at the address RFC 6296 gives for the new binding."""
    assert http_peer(6, SRV1_6) == EXTERNAL6
    inside, outside = "fd01:203:405:1::/64", "2001:db8:1:77::/64"
    nptv6.config = h.deep_merge(nptv6.config, {"nptv6": [{"inside": inside, "outside": outside}]})
    nptv6.path.write_text(h.to_toml(nptv6.config))
    before = nptv6.stderr_len()
    nptv6.signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while not any("reloaded" in line for line in nptv6.stderr_since(before)):
        assert time.monotonic() < deadline and nptv6.alive(), f"no reload within 10 s\n{nptv6.output()}"
        time.sleep(0.1)
    want = rfc6296_map(HOST6, inside, outside)
    assert ipaddress.IPv6Address(want) in ipaddress.IPv6Network(outside)
    assert http_peer(6, SRV1_6) == want
