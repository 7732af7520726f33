"""RFC 5382 (TCP) and RFC 6888 behaviour of a live natrix: unsolicited
inbound SYNs, inbound SYNs to an existing mapping (hole punching), and TCP
hairpinning."""

import concurrent.futures
import ipaddress
import random

import e2e_harness as h
from e2e_harness import (NS_SRV1, NS_SRV2, NS_SRV3, NS_SUB1, NS_SUB2, SRV1, SRV2, SRV3,
                         SUB1, SUB2, AgentError)

h.skip_module_if_unavailable()


def _connect_result(a, to, timeout):
    try:
        r = a.tcp_connect(to, timeout=timeout)
        return ("connected", r)
    except AgentError as e:
        return (e.errno, e.elapsed)


def test_unsolicited_syn_is_not_forwarded(natrix, agent):
    """An inbound SYN to a pool address:port that has no TCP mapping never
    reaches a subscriber, even one listening on that very port (RFC 5382
    REQ-4; RFC 6888 REQ-1 makes RFC 5382 binding on a CGN). natrix must not answer
    it for 6 s; with the default unsolicited_syn = "icmp" it then sends ICMP
    port unreachable, which the remote's kernel reports as ECONNREFUSED."""
    n = natrix()
    port = random.randint(40000, 49999)
    subs = {}
    for ns in (NS_SUB1, NS_SUB2):
        a = agent(ns)
        subs[ns] = (a, a.call("tcp_listen", port=port)["sid"], a.call("sniff_start")["server"])

    nets = [ipaddress.ip_network(p, strict=False) for p in n.pool]
    on_link = str(next(net for net in nets if net.num_addresses == 1).network_address)
    routed = str(next(next(net.hosts()) for net in nets if net.num_addresses > 1))
    targets = {NS_SRV3: (on_link, port), NS_SRV2: (routed, port)}

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = {ns: pool.submit(_connect_result, agent(ns), dst, 9.0)
                for ns, dst in targets.items()}
        results = {ns: f.result(timeout=30) for ns, f in futs.items()}

    for ns, (a, lsid, sniff) in subs.items():
        try:
            acc = a.call("tcp_accept", sid=lsid, timeout=0.2)
            raise AssertionError(f"unsolicited connection was accepted in {ns}: {acc}")
        except AgentError as e:
            assert e.errno == "TIMEOUT", e
        # Only the probing servers' segments count: the subscribers' kernels
        # may still be closing connections of earlier tests with srv1.
        tcp = [e for e in a.events(sniff) if e["proto"] == 6 and e["src"] in (SRV2, SRV3)]
        assert not tcp, f"TCP from the probing servers reached {ns} without any mapping: {tcp[:5]}"

    for ns, (status, info) in results.items():
        dst = targets[ns]
        assert status != "connected", f"{ns} connected to {dst} with no mapping: {info}"
        if status == "ECONNREFUSED":
            assert info is not None and info >= 5.5, (
                f"{ns} -> {dst}: refused after {info:.2f} s; RFC 5382 REQ-4 forbids "
                "answering an unsolicited SYN for at least 6 s")
        assert status == "ECONNREFUSED", (
            f"{ns} -> {dst}: connect ended with {status} after 9 s; with unsolicited_syn = "
            "\"icmp\" (the default) natrix should answer with ICMP port unreachable after 6 s")


def test_inbound_syn_to_existing_mapping_is_forwarded(natrix, agent, servers):
    """With endpoint-independent filtering, an inbound SYN to an existing TCP
    mapping is forwarded (RFC 5382 REQ-1/REQ-3, hole punching; CONTRACTS.md):
    sub1 connects out from port L, then srv3 connects to L's external
    endpoint and sub1's listener on L accepts it, seeing srv3's real address."""
    natrix({"nat": {"filtering": "endpoint-independent"}})
    sub = agent(NS_SUB1)
    port = random.randint(40000, 49999)
    _out, ext = sub.tcp_report((SRV1, h.TCP_REPORT), bind_port=port, reuse=True)
    lsid = sub.call("tcp_listen", port=port, reuse=True)["sid"]

    srv3 = agent(NS_SRV3)
    r = srv3.tcp_connect(ext, timeout=4.0)
    acc = sub.call("tcp_accept", sid=lsid, timeout=2.0)
    assert acc["peer"][0] == SRV3, f"sub1 saw the inbound connection from {acc['peer']}"
    assert acc["local"] == [SUB1, port]
    sub.call("tcp_send", sid=acc["sid"], data="hello-srv3")
    assert srv3.call("tcp_recv", sid=r["sid"], timeout=2.0)["data"] == "hello-srv3"


def test_tcp_hairpinning(natrix, agent, servers):
    """RFC 5382 REQ-8: sub2 connects to sub1's external TCP endpoint; the
    connection is hairpinned to sub1, which sees sub2's external address and
    port (the one srv1 sees for the same sub2 port), never 100.64.0.3."""
    n = natrix()
    sub1, sub2 = agent(NS_SUB1), agent(NS_SUB2)
    p1, p2 = random.randint(40000, 44999), random.randint(45000, 49999)
    _c1, e1 = sub1.tcp_report((SRV1, h.TCP_REPORT), bind_port=p1, reuse=True)
    lsid = sub1.call("tcp_listen", port=p1, reuse=True)["sid"]

    try:
        c2 = sub2.tcp_connect(e1, bind_port=p2, reuse=True, timeout=4.0)
    except AgentError as e:
        raise AssertionError(f"sub2 could not connect to sub1's external endpoint {e1}: {e}")
    acc = sub1.call("tcp_accept", sid=lsid, timeout=2.0)
    peer = tuple(acc["peer"])
    assert peer[0] != SUB2 and not h.is_inside(peer[0]), (
        f"hairpinned connection arrived from sub2's inside address {peer}")
    assert h.in_pool(peer[0], n.pool), f"hairpinned source {peer} not in pool"

    sub1.call("tcp_send", sid=acc["sid"], data="hello-sub2")
    assert sub2.call("tcp_recv", sid=c2["sid"], timeout=2.0)["data"] == "hello-sub2"

    # Endpoint-independent mapping: sub2's port p2 has one external endpoint,
    # so srv1 must see the same one sub1 saw.
    _c3, e2 = sub2.tcp_report((SRV1, h.TCP_REPORT), bind_port=p2, reuse=True)
    assert peer == e2, (f"sub1 saw the hairpinned connection from {peer}, but sub2's "
                        f"external endpoint for port {p2} is {e2}")
