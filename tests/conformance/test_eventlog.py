"""NAT event log (RFC 6888 section 4, RFC 8158 natEvent values) written by replay
with [logging] json: one JSON object per line, capture timestamps, and in port
block mode one record per block instead of one per mapping."""

import json
from datetime import datetime, timezone

import natrix_harness as h
from natrix_harness import POOL1, SRV1, SUB_A, SUB_B, T0

NAT44_BIB_CREATE, NAT44_BIB_DELETE, PORT_BLOCK_ALLOC, PORT_BLOCK_DEALLOC = 8, 9, 16, 17


def replay_with_log(tmp_path, nat, frames, unit=None):
    log = tmp_path / "events.jsonl"
    cfg = h.make_config(nat=nat) + f"[logging]\njson = {json.dumps(str(log))}\n" + (f"unit = {json.dumps(unit)}\n" if unit else "")
    _, report = h.run_replay(cfg, frames, tmp_path)
    return [json.loads(line) for line in log.read_text().splitlines()], report


def flows():
    return [(T0 + i, "inside", h.udp_out(sub, 40000 + i, SRV1, 53)) for i, sub in enumerate([SUB_A, SUB_A, SUB_B])]


def test_mapping_records_carry_who_held_what_and_when(tmp_path):
    # The 5-minute UDP timeout passes before the last frame, so every mapping is deleted.
    frames = flows() + [(T0 + 1000, "inside", h.udp_out(SUB_B, 50000, SRV1, 53))]
    records, report = replay_with_log(tmp_path, {}, frames)
    created = [r for r in records if r["nat_event"] == NAT44_BIB_CREATE]
    deleted = [r for r in records if r["nat_event"] == NAT44_BIB_DELETE]
    assert len(created) == report["mappings_created"] == 4
    assert len(deleted) == 3
    first = created[0]
    assert (first["subscriber"], first["subscriber_port"], first["proto"]) == (SUB_A, 40000, "udp")
    assert (first["external"], first["external_port"]) == (POOL1, 40000)
    when = datetime.fromisoformat(first["time"].replace("Z", "+00:00"))
    assert when == datetime.fromtimestamp(T0, tz=timezone.utc)
    assert all(r["nat_event"] not in (PORT_BLOCK_ALLOC, PORT_BLOCK_DEALLOC) for r in records)


def test_block_mode_logs_one_record_per_block(tmp_path):
    records, report = replay_with_log(tmp_path, {"port_block_size": 64}, flows(), unit="block")
    assert report["mappings_created"] == 3
    assert [r["nat_event"] for r in records] == [PORT_BLOCK_ALLOC, PORT_BLOCK_ALLOC]
    for r, sub in zip(records, [SUB_A, SUB_B]):
        assert r["subscriber"] == sub and r["external"] == POOL1
        assert r["port_range_end"] - r["external_port"] == 63
