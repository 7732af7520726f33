"""`natrix whois ADDRESS:PORT [--proto P] [--at TIME] (--log FILE | --config FILE) [--json]`
(CONTRACTS "Command line"): who held an external address and port at a
time, from the JSON-lines event log a replay writes with `[logging] json`
(CONTRACTS: logging works the same in replay as live, with the capture's
timestamps, "and how whois is tested"), or from a deterministic config's
formula alone. Nobody: say so plainly, exit 1.

Also the replay report's `log_volume` (docs/REPLAY-CONTRACT.md), checked
against the JSON log the same run writes."""

import json
from datetime import datetime, timezone

import pytest

import natrix_harness as h
from natrix_harness import POOL1, SRV1, SUB_A, SUB_B, SUB_C, T0

UDP_TIMEOUT = 300


def iso(ts):
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def replay_logged(tmp_path, frames, nat=None, unit=None):
    log = tmp_path / "events.jsonl"
    logging = f"[logging]\njson = {json.dumps(str(log))}\n" + (f"unit = {json.dumps(unit)}\n" if unit else "")
    outs, report = h.run_replay(h.make_config(nat=nat) + logging, frames, tmp_path)
    return log, outs, report


@pytest.fixture
def logged(tmp_path):
    """SUB_A's UDP mapping at POOL1:40000 from T0; it expires (5 min UDP
    timeout) and is deleted when the clock next moves, at T0 + 400 (SUB_C's
    frame); SUB_B's mapping created at T0 + 1000 is never deleted."""
    frames = [
        (T0, "inside", h.udp_out(SUB_A, 40000, SRV1, 53, b"a")),
        (T0 + 400, "inside", h.udp_out(SUB_C, 45000, SRV1, 53, b"c")),
        (T0 + 1000, "inside", h.udp_out(SUB_B, 40000, SRV1, 53, b"b")),
    ]
    log, outs, _ = replay_logged(tmp_path, frames)
    out_a = h.one(outs, "outside", h.has_payload(b"a")).pkt
    out_b = h.one(outs, "outside", h.has_payload(b"b")).pkt
    assert (out_a[h.IP].src, out_a[h.UDP].sport) == (POOL1, 40000)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    deleted = [r for r in records if r["event"] == "mapping_delete" and r["subscriber"] == SUB_A]
    assert len(deleted) == 1
    end = datetime.fromisoformat(deleted[0]["time"].replace("Z", "+00:00")).timestamp()
    assert T0 + UDP_TIMEOUT <= end <= T0 + 400
    return log, end, f"{out_b[h.IP].src}:{out_b[h.UDP].sport}"


def whois(natrix, *args):
    p = natrix("whois", *args)
    return p.returncode, h.proc_text(p)


def whois_json(natrix, *args):
    p = natrix("whois", *args, "--json")
    return p.returncode, json.loads(p.stdout.decode())


def test_whois_names_the_holder_inside_its_interval(natrix, logged):
    log, end, _ = logged
    rc, out = whois(natrix, f"{POOL1}:40000", "--at", str(T0 + 10), "--log", log)
    assert rc == 0, out
    assert SUB_A in out and "40000" in out, out
    rc, doc = whois_json(natrix, f"{POOL1}:40000", "--proto", "udp", "--at", iso(T0 + 10), "--log", log)
    assert rc == 0 and doc["held"] is True, doc
    [a] = doc["answers"]
    assert (a["subscriber"], a["subscriber_port"], a["proto"]) == (SUB_A, 40000, "udp"), a
    assert (a["external"], a["external_port"]) == (POOL1, 40000), a
    frm = datetime.fromisoformat(a["from"].replace("Z", "+00:00")).timestamp()
    until = datetime.fromisoformat(a["until"].replace("Z", "+00:00")).timestamp()
    assert abs(frm - T0) < 0.001 and abs(until - end) < 0.001, a
    assert a["still_held"] is False


@pytest.mark.parametrize("when", [T0 - 10, "after"])
def test_whois_outside_the_interval_says_nobody_and_exits_1(natrix, logged, when):
    log, end, _ = logged
    at = end + 1 if when == "after" else when
    rc, out = whois(natrix, f"{POOL1}:40000", "--at", str(at), "--log", log)
    assert rc == 1, out
    assert "nobody" in out.lower(), out
    rc, doc = whois_json(natrix, f"{POOL1}:40000", "--at", str(at), "--log", log)
    assert rc == 1 and doc["held"] is False and doc["answers"] == [], doc


def test_whois_filters_by_protocol(natrix, logged):
    log, _, _ = logged
    rc, out = whois(natrix, f"{POOL1}:40000", "--proto", "tcp", "--at", str(T0 + 10), "--log", log)
    assert rc == 1 and "nobody" in out.lower(), out


def test_a_mapping_with_no_delete_is_still_held(natrix, logged):
    log, _, endpoint = logged
    for at in (str(T0 + 1000.5), "2100-01-01T00:00:00Z"):
        rc, doc = whois_json(natrix, endpoint, "--at", at, "--log", log)
        assert rc == 0, doc
        [a] = doc["answers"]
        assert a["subscriber"] == SUB_B and a["still_held"] is True and a["until"] is None, a
    rc, out = whois(natrix, endpoint, "--log", log)  # default: now
    assert rc == 0 and SUB_B in out and "still held" in out, out


def test_whois_reads_port_block_records(natrix, tmp_path):
    log, outs, _ = replay_logged(tmp_path, [(T0, "inside", h.udp_out(SUB_A, 40000, SRV1, 53, b"a"))], nat={"port_block_size": 64}, unit="block")
    p = h.one(outs, "outside", h.has_payload(b"a")).pkt
    rc, doc = whois_json(natrix, f"{p[h.IP].src}:{p[h.UDP].sport}", "--at", str(T0 + 1), "--log", log)
    assert rc == 0, doc
    [a] = doc["answers"]
    lo, hi = a["port_range"]
    assert a["subscriber"] == SUB_A and hi - lo == 63 and lo <= p[h.UDP].sport <= hi, a


DET = h.make_config(pool=("203.0.113.0/31",), nat={
    "mode": "deterministic", "subscribers": ["100.64.0.0/26", "100.64.1.0/27"], "ports_per_subscriber": 1008,
})


def test_whois_answers_a_deterministic_config_from_the_formula(natrix, tmp_path):
    cfg = tmp_path / "det.toml"
    cfg.write_text(DET)
    # Subscriber 70 = 100.64.1.6: second pool address (64 ranges per address), k = 6.
    first = 1024 + 6 * 1008
    rc, doc = whois_json(natrix, f"203.0.113.1:{first + 500}", "--config", cfg)
    assert rc == 0, doc
    assert sorted(a["proto"] for a in doc["answers"]) == ["icmp", "tcp", "udp"], "without --proto: every protocol"
    for a in doc["answers"]:
        assert a["subscriber"] == "100.64.1.6" and a["port_range"] == [first, first + 1007], a
        assert a["always"] is True
    rc, out = whois(natrix, f"203.0.113.1:{first}", "--proto", "tcp", "--config", cfg)
    assert rc == 0 and "100.64.1.6" in out and f"{first}-{first + 1007}" in out, out
    # Subscriber 0 is 100.64.0.0 at the first port of the first address.
    rc, doc = whois_json(natrix, "203.0.113.0:1024", "--proto", "udp", "--config", cfg)
    assert rc == 0 and doc["answers"][0]["subscriber"] == "100.64.0.0", doc
    # 64 ranges of 1008 fill 1024-65535 exactly: the last port is subscriber 63's.
    rc, out = whois(natrix, "203.0.113.0:65535", "--config", cfg)
    assert rc == 0 and "100.64.0.63" in out, out


@pytest.mark.parametrize("endpoint", [
    "203.0.113.1:" + str(1024 + 32 * 1008),  # range 96: past the last subscriber
    "203.0.113.0:1023",                      # below nat.ports
    "198.51.100.1:2000",                     # not a pool address
])
def test_whois_on_a_deterministic_config_says_nobody_for_unassigned_ports(natrix, tmp_path, endpoint):
    cfg = tmp_path / "det.toml"
    cfg.write_text(DET)
    rc, out = whois(natrix, endpoint, "--config", cfg)
    assert rc == 1 and "nobody" in out.lower(), out


def test_whois_refuses_bad_arguments(natrix, tmp_path, logged):
    log, _, _ = logged
    for args in (["203.0.113.1", "--log", log], ["203.0.113.1:80", "--at", "yesterday", "--log", log], ["203.0.113.1:80"]):
        rc, out = whois(natrix, *args)
        assert rc != 0 and "nobody" not in out.lower(), f"{args}: {out}"


@pytest.mark.parametrize("unit,key", [("mapping", "per_mapping"), ("session", "per_session")])
def test_log_volume_matches_the_log_the_run_writes(tmp_path, unit, key):
    frames = []
    for i, sub in enumerate([SUB_A, SUB_B, SUB_A]):
        frames.append((T0 + i, "inside", h.udp_out(sub, 41000 + i, SRV1, 53, b"q")))
        frames.append((T0 + i + 0.5, "inside", h.udp_out(sub, 41000 + i, h.SRV2, 53, b"q2")))
    frames.append((T0 + 2000, "inside", h.udp_out(SUB_B, 42000, SRV1, 53, b"late")))
    log, _, rep = replay_logged(tmp_path, frames, unit=unit)
    lines = log.read_text().splitlines()
    vol = rep["log_volume"]
    assert vol[key]["records"] == len(lines), (vol, lines)
    assert vol[key]["bytes"] == log.stat().st_size, vol
    assert vol[key]["estimated"] is False
    assert vol["per_mapping"]["records"] == 2 * 3 + 1  # 4 mappings, 3 deleted
    assert vol["per_session"]["records"] == vol["per_mapping"]["records"] + 2 * 6 + 1, vol  # 7 sessions, 6 deleted
    assert vol["deterministic"] == {"records": 0, "bytes": 0, "estimated": False}
    assert set(vol["port_block"]) >= {"64", "256", "1024"}, vol
    # Two subscribers, one block each at a time: far fewer records than per mapping.
    assert 0 < vol["port_block"]["64"]["records"] <= vol["per_mapping"]["records"]


def test_log_volume_counts_the_configured_block_size_from_the_run(tmp_path):
    frames = [(T0 + i, "inside", h.udp_out(sub, 41000 + i, SRV1, 53, b"q")) for i, sub in enumerate([SUB_A, SUB_B, SUB_A])]
    log, _, rep = replay_logged(tmp_path, frames, nat={"port_block_size": 128}, unit="block")
    blocks = rep["log_volume"]["port_block"]["128"]
    assert blocks == {"records": len(log.read_text().splitlines()), "bytes": log.stat().st_size, "estimated": False}, rep["log_volume"]
    # The simulation of 64-port blocks agrees on this simple traffic: one block per subscriber.
    assert rep["log_volume"]["port_block"]["64"]["records"] == 2
