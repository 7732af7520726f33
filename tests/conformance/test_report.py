"""The JSON report of ``natrix replay --report`` (contract "Report"), checked
against counts computed here from the scenario and from the output capture."""

import natrix_harness as h
from natrix_harness import IP, SRV1, SRV2, T0, UDP, has_payload, one, raw_in, udp_in, udp_out

POOL_A, POOL_B = "203.0.113.1", "192.0.2.200"
RANGE = (1024, 65535)
RANGE_SIZE = RANGE[1] - RANGE[0] + 1


def _expected_keys(rep):
    for k in ("packets", "drops", "mappings_created", "sessions_created", "peak_sessions", "peak_mappings",
              "subscribers", "ports_per_subscriber", "pool"):
        assert k in rep, f"report lacks {k!r}: {sorted(rep)}"
    for k in ("in", "in_inside", "in_outside", "out", "out_inside", "out_outside", "generated", "dropped"):
        assert k in rep["packets"], f"report.packets lacks {k!r}"
    for k in ("p50", "p99", "max"):
        assert k in rep["ports_per_subscriber"], f"report.ports_per_subscriber lacks {k!r}"
    for k in ("addresses", "ports", "peak_ports_used", "peak_utilisation"):
        assert k in rep["pool"], f"report.pool lacks {k!r}"


def test_report_counts(replay):
    """Five subscribers hold 1, 1, 2, 6 and 6 UDP ports (16 mappings; one
    mapping talks to two servers, so 17 sessions); four frames are dropped for
    four different reasons; one ICMP time exceeded is generated. The report's
    packet counters must match the input and the output file, drops by reason
    must be exact and non-zero only, mappings/sessions/peaks/subscribers must be
    the numbers above, ports per subscriber p50 = 2, p99 = max = 6 (nearest
    rank over 1,1,2,6,6), and the pool figures must follow from 2 addresses x
    64512 ports x 3 protocols and 16 ports in use (contract definitions)."""
    cfg = h.make_config(pool=[POOL_A + "/32", POOL_B + "/32"])
    subs = ["100.64.0.50", "100.64.0.51", "100.64.0.52", "100.64.0.53", "100.64.0.54"]
    nports = [1, 1, 2, 6, 6]
    frames = []
    t = T0
    for s_i, (sub, n) in enumerate(zip(subs, nports)):
        for k in range(n):
            frames.append((t, "inside", udp_out(sub, 41000 + 2 * k, SRV1, 53, b"s%dk%d" % (s_i, k))))
            t += 0.01
    # sub 1: a second packet of its existing flow (no new mapping or session)
    frames.append((t, "inside", udp_out(subs[1], 41000, SRV1, 53, b"again"))); t += 0.01
    # sub 3: its first mapping also talks to a second server (new session, same mapping)
    frames.append((t, "inside", udp_out(subs[3], 41000, SRV2, 53, b"second-server"))); t += 0.01
    outs, _ = replay(cfg, frames)
    ext0 = one(outs, "outside", has_payload(b"s0k0")).pkt
    # inbound reply to sub 0
    frames.append((t, "outside", udp_in(SRV1, 53, ext0[IP].src, ext0[UDP].sport, b"reply0"))); t += 0.01
    # drops: no_mapping, not_for_pool, ipv4_bad_checksum, ttl_expired (on an existing flow)
    frames.append((t, "outside", udp_in(SRV1, 53, POOL_A, 60001, b"nomap"))); t += 0.01
    frames.append((t, "outside", udp_in(SRV1, 53, "203.0.113.99", 41000, b"notpool"))); t += 0.01
    bad = bytearray(h.ip_bytes(udp_out(subs[2], 41000, SRV1, 53, b"badck")))
    bad[10] ^= 0x11
    frames.append((t, "inside", raw_in(subs[2], bytes(bad)))); t += 0.01
    frames.append((t, "inside", udp_out(subs[0], 41000, SRV1, 53, b"ttl1", ttl=1))); t += 0.01
    outs, rep = replay(cfg, frames)
    _expected_keys(rep)

    n_in_inside = sum(1 for f in frames if f[1] == "inside")
    n_in_outside = sum(1 for f in frames if f[1] == "outside")
    pk = rep["packets"]
    assert (pk["in"], pk["in_inside"], pk["in_outside"]) == (len(frames), n_in_inside, n_in_outside), pk
    out_in = sum(1 for o in outs if o.side == "inside")
    out_out = sum(1 for o in outs if o.side == "outside")
    assert (pk["out"], pk["out_inside"], pk["out_outside"]) == (len(outs), out_in, out_out), pk
    assert out_out == sum(nports) + 2, h.dump(outs)          # every outbound datagram
    assert out_in == 2, h.dump(outs)                          # reply0 + the time exceeded
    assert pk["generated"] == 1, pk
    expected_drops = {"no_mapping": 1, "not_for_pool": 1, "ipv4_bad_checksum": 1, "ttl_expired": 1}
    assert rep["drops"] == expected_drops, rep["drops"]
    assert pk["dropped"] == 4, pk
    assert rep["mappings_created"] == 16, rep
    assert rep["sessions_created"] == 17, rep
    assert rep["peak_mappings"] == 16, rep
    assert rep["peak_sessions"] == 17, rep
    assert rep["subscribers"] == 5, rep
    assert rep["ports_per_subscriber"] == {"p50": 2, "p99": 6, "max": 6}, rep["ports_per_subscriber"]
    pool = rep["pool"]
    assert pool["addresses"] == 2, pool
    # contract: every port of nat.ports on every pool address, TCP+UDP+ICMP together
    assert pool["ports"] == 3 * 2 * RANGE_SIZE, pool
    assert pool["peak_ports_used"] == 16, pool
    frac = 16 / pool["ports"]
    assert abs(pool["peak_utilisation"] - frac) <= 1e-9 + 1e-6 * frac, \
        f"peak_utilisation {pool['peak_utilisation']} != peak_ports_used/ports = {frac}"
    # contract identities
    assert pk["in"] == pk["out"] - pk["generated"] + pk["dropped"], pk


def test_report_peaks_are_concurrent(replay):
    """Peaks count what is held at the same time, totals what was ever
    created: a subscriber's UDP mapping expires (udp = 2m) before it opens the
    next one, three times over: mappings_created = sessions_created = 3, but
    peak_mappings = peak_sessions = 1, ports per subscriber max 1, and
    peak_ports_used 1."""
    cfg = h.make_config(timeouts={"udp": "2m"})
    frames = [(T0 + 200 * i, "inside", udp_out("100.64.0.60", 42000 + 2 * i, SRV1, 53, b"m%d" % i))
              for i in range(3)]
    outs, rep = replay(cfg, frames)
    for i in range(3):
        one(outs, "outside", has_payload(b"m%d" % i))
    assert rep["mappings_created"] == 3 and rep["sessions_created"] == 3, rep
    assert rep["peak_mappings"] == 1 and rep["peak_sessions"] == 1, rep
    assert rep["ports_per_subscriber"]["max"] == 1, rep["ports_per_subscriber"]
    assert rep["pool"]["peak_ports_used"] == 1, rep["pool"]
    assert rep["subscribers"] == 1, rep
