"""RFC 4787 (UDP) behaviour of a live natrix: endpoint-independent mapping
(REQ-1), paired pooling (REQ-2), port parity (REQ-6), filtering (REQ-8) and
hairpinning (REQ-9), observed from the servers' and subscribers' sockets."""

import random

import pytest

import e2e_harness as h
from e2e_harness import (NS_SRV1, NS_SRV3, NS_SUB1, NS_SUB2, SRV1, SRV2, SRV3, SUB2,
                         QUIET)

h.skip_module_if_unavailable()


def test_endpoint_independent_mapping(natrix, agent, servers):
    """REQ-1: one internal address:port is mapped to the same external
    address:port whatever the destination address and port."""
    n = natrix()
    sub = agent(NS_SUB1)
    sid = sub.udp_open()
    seen = {dst: sub.echo(sid, dst, f"eim-{dst[0]}-{dst[1]}")
            for dst in ((SRV1, h.UDP_ECHO), (SRV2, h.UDP_ECHO), (SRV1, h.UDP_ECHO2),
                        (SRV3, h.UDP_ECHO2))}
    assert len(set(seen.values())) == 1, (
        f"one socket was given different external endpoints per destination: {seen}")
    ext = next(iter(seen.values()))
    assert h.in_pool(ext[0], n.pool), f"external address {ext} not in pool"


@pytest.mark.parametrize("filtering, same_host_other_port, other_host", [
    ("endpoint-independent", True, True),
    ("address-dependent", True, False),
    ("address-and-port-dependent", False, False),
])
def test_filtering(natrix, agent, servers, filtering, same_host_other_port, other_host):
    """REQ-8 and its alternatives: after sub1 sends to srv1:7000, which
    remotes may send to sub1's mapping. Endpoint-independent: anyone;
    address-dependent: only srv1 (any port); address-and-port-dependent:
    only srv1:7000. srv1:7000 itself always gets through."""
    natrix({"nat": {"filtering": filtering}})
    sub = agent(NS_SUB1)
    sid = sub.udp_open()
    ext = sub.echo(sid, (SRV1, h.UDP_ECHO), "open-mapping")

    def probe(remote_agent, remote_addr, port, tag):
        rs = remote_agent.udp_open(bind_port=port)
        remote_agent.udp_send(rs, tag, to=ext)
        got = sub.udp_expect_nothing(sid, timeout=QUIET)
        remote_agent.call("close", sid=rs)
        if got is None:
            return False
        data, src = got
        assert data == tag, f"unexpected datagram {got!r}"
        assert src == (remote_addr, port), (
            f"inbound datagram from {(remote_addr, port)} arrived with source {src}")
        return True

    srv1, srv3 = agent(NS_SRV1), agent(NS_SRV3)
    other_port = random.randint(20000, 29999)
    got = probe(srv1, SRV1, other_port, "srv1-other-port")
    assert got == same_host_other_port, (
        f"filtering={filtering}: a datagram from srv1:{other_port} (sub1 only sent to "
        f"srv1:{h.UDP_ECHO}) to {ext} was {'delivered' if got else 'dropped'}")
    got = probe(srv3, SRV3, random.randint(30000, 39999), "srv3-unsolicited")
    assert got == other_host, (
        f"filtering={filtering}: a datagram from srv3 (never contacted) to {ext} was "
        f"{'delivered' if got else 'dropped'}")
    # The mapping itself still works for the endpoint sub1 did contact.
    assert sub.echo(sid, (SRV1, h.UDP_ECHO), "still-open") == ext


def test_udp_hairpinning(natrix, agent, servers):
    """REQ-9: sub2 sends to sub1's external address:port and sub1 receives
    it from sub2's external address:port (not 100.64.0.3); sub1's answer to
    that external endpoint reaches sub2 from sub1's external endpoint."""
    n = natrix()
    sub1, sub2 = agent(NS_SUB1), agent(NS_SUB2)
    s1, s2 = sub1.udp_open(), sub2.udp_open()
    e1 = sub1.echo(s1, (SRV1, h.UDP_ECHO), "learn-e1")
    e2 = sub2.echo(s2, (SRV1, h.UDP_ECHO), "learn-e2")
    assert h.in_pool(e1[0], n.pool) and h.in_pool(e2[0], n.pool)

    sub2.udp_send(s2, "hairpin-to-sub1", to=e1)
    got = sub1.udp_expect_nothing(s1, timeout=2.0)
    assert got is not None, f"sub2's datagram to sub1's external endpoint {e1} never arrived"
    data, src = got
    assert data == "hairpin-to-sub1"
    assert src[0] != SUB2 and not h.is_inside(src[0]), (
        f"hairpinned datagram arrived from sub2's inside address {src}; "
        f"RFC 4787 REQ-9 requires its external endpoint {e2}")
    assert src == e2, f"hairpinned datagram source {src}, expected sub2's external endpoint {e2}"

    sub1.udp_send(s1, "hairpin-to-sub2", to=e2)
    got = sub2.udp_expect_nothing(s2, timeout=2.0)
    assert got is not None, f"sub1's reply to sub2's external endpoint {e2} never arrived"
    assert got == ("hairpin-to-sub2", e1), f"sub2 got {got}, expected data from {e1}"


@pytest.mark.parametrize("port_selection", ["preserve", "random"])
def test_port_parity(natrix, agent, servers, port_selection):
    """REQ-6 (port_parity = true): an even internal port gets an even
    external port and an odd one an odd port, also when the port cannot be
    preserved (below the configured range) or is chosen at random."""
    natrix({"nat": {"port_parity": True, "port_selection": port_selection}})
    sub = agent(NS_SUB1)
    base = random.randrange(30000, 60000, 2)
    ports = [base + i for i in range(10)] + [500, 501]  # 500/501: outside 1024-65535
    seen = {}
    for p in ports:
        sid = sub.udp_open(bind_port=p)
        seen[p] = sub.echo(sid, (SRV1, h.UDP_ECHO), f"parity-{p}")[1]
    wrong = {p: e for p, e in seen.items() if p % 2 != e % 2}
    assert not wrong, f"parity not preserved (internal -> external port): {wrong}"
    low = [seen[500], seen[501]]
    assert all(1024 <= e <= 65535 for e in low), (
        f"ports 500/501 were mapped to {low}, outside the configured range 1024-65535")


def test_paired_pooling(natrix, agent, servers):
    """REQ-2: all of a subscriber's mappings (UDP and TCP, many destinations
    and source ports) use one external address of a multi-address pool."""
    n = natrix()
    sub = agent(NS_SUB1)
    addrs = {}
    for i, dst in enumerate([(SRV1, h.UDP_ECHO), (SRV2, h.UDP_ECHO), (SRV3, h.UDP_ECHO),
                             (SRV1, h.UDP_ECHO2), (SRV2, h.UDP_ECHO2), (SRV3, h.UDP_ECHO2)] * 2):
        sid = sub.udp_open()
        addrs[f"udp#{i} -> {dst}"] = sub.echo(sid, dst, f"pair-{i}")
    for srv in (SRV1, SRV2, SRV3):
        _sid, peer = sub.tcp_report((srv, h.TCP_REPORT))
        addrs[f"tcp -> {srv}"] = peer
    external = {peer[0] for peer in addrs.values()}
    assert len(external) == 1, f"one subscriber got several external addresses: {addrs}"
    assert h.in_pool(external.pop(), n.pool)
