"""PCP (RFC 6887) through a live natrix in the lab: a subscriber asks
natrix's PCP server (100.64.0.1:5351) for a MAP mapping with `natrix pcp`,
and an outside host then reaches the subscriber through it; the mapping is
an ordinary one (`natrix show mappings`), ends when deleted, and errors come
back as PCP result codes with a non-zero exit status."""

import json
import time

import pytest

import e2e_harness as h
from e2e_harness import NS_SRV3, NS_SUB1, QUIET, SRV3, SUB1, SUB2

h.skip_module_if_unavailable()

SERVER = "100.64.0.1"
PCP = {"pcp": {"enabled": True, "max_lifetime": "1h"}}


def pcp(*args, timeout=30):
    """`natrix pcp ARGS --server 100.64.0.1 --json` in nx-sub1: (exit status, answer or None, output)."""
    r = h.run_in(NS_SUB1, h.natrix_bin(), "pcp", *args, "--server", SERVER, "--json", timeout=timeout)
    out = r.stdout.strip()
    try:
        answer = json.loads(out.splitlines()[-1]) if out else None
    except ValueError:
        answer = None
    return r.returncode, answer, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"


def show_mappings(n):
    r = n.cli("show", "mappings", "--json", "--subscriber", SUB1)
    assert r.returncode == 0, f"`natrix show mappings` failed:\n{r.stdout}\n{r.stderr}"
    doc = json.loads(r.stdout)
    return doc if isinstance(doc, list) else next(v for v in doc.values() if isinstance(v, list))


def has_mapping(rows, iport, ext):
    """Whether `show mappings --json` rows hold sub1:IPORT <-> EXT."""
    return any(f"{SUB1}:{iport}" in json.dumps(m) and f"{ext[0]}:{ext[1]}" in json.dumps(m) for m in rows)


def send_until_received(sender, sid, to, receiver, rsid, data, tries=4):
    """Sends `data` from `sender` to `to` until `receiver` gets it (the
    first datagram may wait for ARP); returns (data, source) or None."""
    for _ in range(tries):
        sender.udp_send(sid, data, to=to)
        got = receiver.udp_expect_nothing(rsid, timeout=1.0)
        if got is not None:
            return got
    return None


@pytest.mark.parametrize("workers", [1, 2])
def test_pcp_map_round_trip_through_the_lab(natrix, agent, workers):
    n = natrix({**PCP, "workers": workers})
    sub1, srv3 = agent(NS_SUB1), agent(NS_SRV3)
    listener = sub1.udp_open(bind_port=5000)

    rc, a, out = pcp("map", "--protocol", "udp", "--internal-port", "5000", "--lifetime", "600")
    assert rc == 0 and a, f"`natrix pcp map` failed:\n{out}"
    assert (a["opcode"], a["result"], a["result_code"]) == ("MAP", "SUCCESS", 0), a
    assert a["lifetime"] == 600 and a["internal_port"] == 5000 and a["protocol"] == "udp", a
    ext = (a["external_address"], a["external_port"])
    assert h.in_pool(ext[0], n.pool), f"external address {ext} is not a pool address"

    # An outside host that never heard from sub1 reaches it through the mapping.
    s3 = srv3.udp_open()
    got = send_until_received(srv3, s3, ext, sub1, listener, "through-pcp")
    assert got is not None, f"nothing reached sub1:5000 from {SRV3} via {ext}\n{n.output()}"
    assert got[0] == "through-pcp" and got[1][0] == SRV3, got
    # And sub1's answer leaves from the same external endpoint.
    sub1.udp_send(listener, "back", to=got[1])
    data, src = srv3.udp_recv(s3, timeout=3.0)
    assert (data, src) == ("back", ext), (data, src, ext)

    # An ordinary mapping: `natrix show mappings` lists it.
    rows = show_mappings(n)
    assert has_mapping(rows, 5000, ext), f"PCP mapping not in `show mappings`: {rows}"

    # A refresh with the same nonce keeps the endpoint; another nonce is refused.
    rc, again, out = pcp("map", "--protocol", "udp", "--internal-port", "5000", "--lifetime", "600", "--nonce", a["nonce"])
    assert rc == 0 and (again["external_address"], again["external_port"]) == ext, out
    rc, other, out = pcp("map", "--protocol", "udp", "--internal-port", "5000", "--nonce", "00" * 12)
    assert rc != 0 and other and other["result"] == "NOT_AUTHORIZED", out

    # A mapping that carried no traffic, deleted (lifetime 0, same nonce),
    # is gone: the outside host no longer gets through. (The one above
    # lives on while its traffic sessions do, like any mapping.)
    quiet = sub1.udp_open(bind_port=5002)
    rc, b, out = pcp("map", "--protocol", "udp", "--internal-port", "5002", "--lifetime", "600")
    assert rc == 0, out
    ext_b = (b["external_address"], b["external_port"])
    assert has_mapping(show_mappings(n), 5002, ext_b), "second PCP mapping not shown"
    rc, gone, out = pcp("map", "--protocol", "udp", "--internal-port", "5002", "--lifetime", "0", "--nonce", b["nonce"])
    assert rc == 0 and gone["lifetime"] == 0 and gone["result"] == "SUCCESS", out
    assert not has_mapping(show_mappings(n), 5002, ext_b), "deleted PCP mapping still shown"
    srv3.udp_send(srv3.udp_open(), "after-delete", to=ext_b)
    assert sub1.udp_expect_nothing(quiet, timeout=QUIET) is None, "the deleted mapping still lets traffic in"


def test_pcp_errors_and_announce(natrix, agent):
    natrix(PCP)
    # The client address in the request is not the packet's source.
    rc, a, out = pcp("map", "--protocol", "udp", "--internal-port", "6000", "--client-ip", SUB2)
    assert rc != 0 and a and a["result"] == "ADDRESS_MISMATCH" and a["result_code"] == 12, out
    rc, a, out = pcp("map", "--protocol", "132", "--internal-port", "6000")
    assert rc != 0 and a and a["result"] == "UNSUPP_PROTOCOL", out
    rc, a, out = pcp("announce")
    assert rc == 0 and a and a["result"] == "SUCCESS" and a["opcode"] == "ANNOUNCE", out
    first = a["epoch"]
    time.sleep(1.2)
    rc, a, out = pcp("announce")
    assert rc == 0 and a["epoch"] >= first + 1, out


def test_pcp_disabled_gets_no_answer(natrix):
    natrix()
    rc, a, out = pcp("announce", "--timeout", "0.3", "--tries", "2", timeout=15)
    assert rc != 0 and a is None and "no answer" in out, out
