"""Basic forwarding through a live natrix: TCP (HTTP), UDP, ICMP echo and
ICMP error translation (RFC 5508)."""

import concurrent.futures
import json
import secrets
import shutil
import sys

import pytest

import e2e_harness as h
from e2e_harness import NS_SRV1, NS_SRV2, NS_SUB1, NS_SUB2, SRV1, SRV2, AgentError

h.skip_module_if_unavailable()


def _http_get(ns, url):
    if shutil.which("curl"):
        return h.run_in(ns, "curl", "-sS", "--noproxy", "*", "--max-time", "5",
                        "--connect-timeout", "4", url, timeout=15)
    code = ("import sys, urllib.request as u; "
            "sys.stdout.write(u.build_opener(u.ProxyHandler({}))"
            ".open(sys.argv[1], timeout=5).read().decode())")
    return h.run_in(ns, "python3", "-c", code, url, timeout=15)


@pytest.mark.parametrize("io", ["af_xdp", "af_packet"])
@pytest.mark.parametrize("workers", [1, 2])
def test_http_fetch_is_translated(natrix, agent, workers, io):
    """A subscriber fetches a page over TCP; the server sees a pool address,
    never the subscriber's 100.64/10 address (NAPT44, RFC 5382). With two
    workers the frames cross the I/O thread's rings and each worker
    translates them in batches; with one, AF_XDP forwards each frame from
    where it was received, and AF_PACKET from natrix's copy."""
    n = natrix({"workers": workers, "io": io})
    srv = agent(NS_SRV1)
    body = "natrix-e2e-" + secrets.token_hex(16)
    server = srv.call("http_server", port=h.HTTP_PORT, body=body)["server"]

    r = _http_get(NS_SUB1, f"http://{SRV1}:{h.HTTP_PORT}/e2e")
    assert r.returncode == 0, f"HTTP fetch from nx-sub1 failed:\n{r.stdout}\n{r.stderr}"
    assert r.stdout == body, f"wrong body: {r.stdout[:200]!r}"

    peers = [tuple(e["peer"]) for e in srv.events(server)]
    assert peers, "the HTTP server recorded no request"
    for ip, _port in peers:
        assert not h.is_inside(ip), f"server saw the subscriber's inside address {ip}"
        assert h.in_pool(ip, n.pool), f"server saw {ip}, which is not in the pool {n.pool}"


@pytest.mark.parametrize("io", ["af_xdp", "af_packet"])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("size", [16, 1400])
def test_udp_echo_round_trip(natrix, agent, servers, size, workers, io):
    """UDP from a subscriber reaches the server from a pool address, and the
    answer comes back to the subscriber from the server's own address (RFC 4787);
    the kernels on both ends verify the UDP checksums."""
    n = natrix({"workers": workers, "io": io})
    sub = agent(NS_SUB1)
    sid = sub.udp_open()
    payload = ("udp-" + secrets.token_hex(size))[:size]
    peer = sub.echo(sid, (SRV1, h.UDP_ECHO), payload)
    assert h.in_pool(peer[0], n.pool) and not h.is_inside(peer[0]), (
        f"server saw {peer}, expected a pool address of {n.pool}")


def test_ping_from_both_subscribers(natrix, agent):
    """ICMP echo from two subscribers (same identifier on purpose) to srv2 is
    translated both ways (RFC 5508 ICMP query mappings): each subscriber gets
    its own replies with its own identifier, checksums valid, and srv2 sees
    only pool addresses."""
    n = natrix()
    srv = agent(NS_SRV2)
    sniff = srv.call("sniff_start")["server"]
    subs = [agent(ns) for ns in (NS_SUB1, NS_SUB2)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(a.call, "icmp_ping", dst=SRV2, count=3, ident=4242, timeout=2.0,
                            tag=a.ns, _timeout=15) for a in subs]
        results = [f.result(timeout=20) for f in futs]
    for ns, r in zip((NS_SUB1, NS_SUB2), results):
        assert r["answered"], f"ICMP echo from {ns} to {SRV2} got no reply: {r}"
        assert len(r["answered"]) >= 2, f"ICMP echo from {ns}: most replies lost: {r}"

    requests = [e for e in srv.events(sniff) if e["proto"] == 1 and e.get("type") == 8]
    assert requests, "srv2 saw no ICMP echo request"
    for e in requests:
        assert not h.is_inside(e["src"]), f"echo request reached srv2 from inside address {e}"
        assert h.in_pool(e["src"], n.pool), f"echo request source {e['src']} not in pool"


def test_udp_port_unreachable_reaches_subscriber(natrix, agent):
    """srv2 answers UDP to a closed port with ICMP port unreachable; natrix
    translates the error (outer and embedded headers) back to the subscriber
    (RFC 5508 REQ-3/REQ-4), so its connected socket reports ECONNREFUSED."""
    natrix()
    sub = agent(NS_SUB1)
    closed_port = 9  # nothing listens on srv2:9
    sid = sub.udp_open(connect=[SRV2, closed_port])
    last = None
    for attempt in range(3):
        sub.udp_send(sid, f"anyone-there-{attempt}")
        try:
            got = sub.udp_recv(sid, timeout=1.5)
            pytest.fail(f"unexpected answer from a closed port: {got!r}")
        except AgentError as e:
            last = e.errno
            if e.errno != "TIMEOUT":
                break
    assert last == "ECONNREFUSED", (
        f"the subscriber's connected UDP socket got {last}, expected ECONNREFUSED from the "
        "translated ICMP port unreachable")


def _system_calls():
    """natrix's system calls so far, and the frames it has sent."""
    r = h.run_in(h.NS_NAT, "curl", "-sS", "--noproxy", "*", "-m", "5", f"http://{h.DEFAULT_API}/api/stats", timeout=10)
    assert r.returncode == 0, f"/api/stats: {r.stderr}"
    stats = json.loads(r.stdout)
    sent = sum(i["tx_packets"] for i in stats["interfaces"].values())
    return {**stats["system_calls"], "sent": sent}


@pytest.mark.parametrize("busy_poll", [False, True])
def test_af_xdp_forwards_with_batched_system_calls(natrix, agent, servers, busy_poll):
    """AF_XDP, one worker, with and without busy polling: 200 UDP echoes
    each reach the server and come back (the kernels verify every checksum),
    with at most one transmit system call per frame sent (copy mode kicks
    the kernel once per round, whatever the round holds; the AF_XDP unit
    tests show a burst's frames sharing kicks). The sockets prefer busy
    polling either way, so polls that find them empty ask the kernel to run
    the device's receive work (receive calls); only without `busy_poll`
    does the thread sleep between the echoes, which wait for the server's
    answer far longer than natrix polls before sleeping."""
    natrix({"io": "af_xdp", "busy_poll": busy_poll})
    sub = agent(NS_SUB1)
    sid = sub.udp_open()
    before = _system_calls()
    for i in range(200):
        sub.echo(sid, (SRV1, h.UDP_ECHO), f"batched-{i}")
    after = _system_calls()
    calls = {k: after[k] - before[k] for k in after}
    # At least two frames per echo: the request out, the answer in (and
    # natrix's own ARP).
    assert calls["sent"] >= 400, calls
    assert 0 < calls["transmit"] <= calls["sent"], calls
    assert calls["receive"] > 0, f"no receive call on an empty poll (the busy poll of the device's receive work): {calls}"
    if busy_poll:
        assert calls["wait"] == 0, f"a busy-polling thread slept: {calls}"
    else:
        assert calls["wait"] > 0, f"the thread never slept between echoes: {calls}"


# Sends one UDP datagram of argv[3] bytes with DF clear (IP_PMTUDISC_DONT).
SEND_WITHOUT_DF = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                   "s.setsockopt(socket.IPPROTO_IP, 10, 0); "
                   "s.sendto(bytes(i % 251 for i in range(int(sys.argv[3]))), (sys.argv[1], int(sys.argv[2])))")


def test_a_datagram_without_df_larger_than_the_outside_mtu_leaves_as_fragments(natrix, agent):
    """RFC 4787 REQ-13: natrix's outside link takes 1400 bytes; a 1450-byte
    UDP datagram from sub1 with DF clear reaches srv1 whole and translated:
    natrix sent it as fragments that fit, which srv1's kernel put together."""
    h.sh("ip", "link", "set", "outside", "mtu", "1400", ns=h.NS_NAT)
    try:
        n = natrix()
        srv = agent(NS_SRV1)
        sid = srv.udp_open(bind_port=7301)
        got = None
        for _ in range(3):  # the first may wait for natrix's ARP
            h.sh(sys.executable, "-c", SEND_WITHOUT_DF, SRV1, "7301", "1450", ns=NS_SUB1)
            try:
                got = srv.udp_recv(sid, timeout=1.0)
                break
            except AgentError:
                continue
        assert got, "the 1450-byte datagram never reached srv1"
        data, peer = got
        assert data.encode("latin-1") == bytes(i % 251 for i in range(1450)), "the datagram arrived altered"
        assert h.in_pool(peer[0], n.pool), f"not translated: from {peer}"
    finally:
        h.sh("ip", "link", "set", "outside", "mtu", "1500", ns=h.NS_NAT)
