"""RFC 6888 REQ-4: a per-subscriber limit on external ports, enforced live
without starving other subscribers or evicting existing mappings."""

import e2e_harness as h
from e2e_harness import NS_SUB1, NS_SUB2, SRV1

h.skip_module_if_unavailable()

LIMIT = 8


def test_per_subscriber_port_limit(natrix, agent, servers):
    """With max_ports_per_subscriber = 8, sub1's first 8 UDP mappings work
    and the next 8 are dropped (srv1 sees exactly 8 distinct external ports
    from sub1); existing mappings keep working (RFC 6888 REQ-11: no eviction)
    and sub2 is not affected. The refused ones get ICMP host unreachable,
    natrix's documented default (exhaustion_icmp = "host-unreachable")."""
    n = natrix({"nat": {"max_ports_per_subscriber": LIMIT}})
    sub1, sub2, srv1 = agent(NS_SUB1), agent(NS_SUB2), servers[SRV1]
    echo = (SRV1, h.UDP_ECHO)

    # sub2 first: resolves natrix's neighbours so no frame of sub1's burst is lost to ARP.
    warm = sub2.udp_open()
    sub2.echo(warm, echo, "sub2-warmup")

    results = h.udp_burst(sub1, 2 * LIMIT, echo, "sub1")
    ok = [i for i, r in enumerate(results) if r[0] == "ok"]

    # What srv1 itself received from sub1, independently of the echoes.
    sub1_ports = {tuple(e["peer"]) for e in srv1.events(srv1.server_ids["udp_echo"])
                  if e["data"].startswith("sub1-")}
    assert len(sub1_ports) == LIMIT, (
        f"srv1 saw {len(sub1_ports)} distinct external endpoints from sub1 with "
        f"max_ports_per_subscriber = {LIMIT}: {sorted(sub1_ports)}")
    assert ok == list(range(LIMIT)), (
        f"expected the first {LIMIT} mappings to work and the rest to be refused; "
        f"worked: {ok}; results: {[(r[0], r[1]) for r in results]}")
    for ip, _ in sub1_ports:
        assert h.in_pool(ip, n.pool)

    # sub2 is not limited by sub1's quota, at the same time.
    sub2_results = h.udp_burst(sub2, 3, echo, "sub2")
    assert all(r[0] == "ok" for r in sub2_results), (
        f"sub2 was refused while sub1 was at its limit: {sub2_results}")

    # sub1's existing mappings were not evicted and still work.
    first_sid, first_peer = results[0][2], results[0][1]
    assert sub1.echo(first_sid, echo, "sub1-0-again") == first_peer

    refused = [r[1] for r in results[LIMIT:]]
    assert all(e == "EHOSTUNREACH" for e in refused), (
        "over-quota datagrams should be answered with ICMP destination unreachable code 1 "
        f"(host unreachable, the default exhaustion_icmp); the sockets got {refused}")

