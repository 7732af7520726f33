"""Replay determinism (issue #3 item 7, contract: "the same input and config give
the same output, byte for byte"; pseudo-random choices come from `seed`)."""

import random
from pathlib import Path

import pytest

import natrix_harness as h
from natrix_harness import POOL28, SRV1, SRV2, SRV3, T0, UDP, has_payload, one

REPO = h.REPO_ROOT


def _mixed_frames(rng, n_subs=12, n_flows=60):
    subs = [f"100.64.1.{10 + i}" for i in range(n_subs)]
    frames = []
    t = T0
    for i in range(n_flows):
        sub = rng.choice(subs)
        sport = rng.choice([40000, 40001, 5060, 1234]) if rng.random() < 0.4 else rng.randrange(1024, 65536)
        dst = rng.choice([SRV1, SRV2, SRV3])
        kind = rng.choice(["udp", "tcp", "icmp"])
        if kind == "udp":
            f = h.udp_out(sub, sport, dst, rng.choice([53, 443, 123]), b"d%d" % i)
        elif kind == "tcp":
            f = h.tcp_out(sub, sport, dst, rng.choice([80, 443]), "S", seq=1000 + i)
        else:
            f = h.echo_out(sub, dst, rng.randrange(0, 65536), seq=i)
        frames.append((t, "inside", f))
        t += rng.random() * 0.5
    # unsolicited inbound SYN (held, then answered) and an inbound datagram without mapping
    frames.append((t, "outside", h.tcp_in(SRV1, 5555, "203.0.113.7", 22, "S", seq=1)))
    frames.append((t + 0.1, "outside", h.udp_in(SRV1, 53, "203.0.113.7", 9999, b"nomap")))
    return frames


@pytest.mark.parametrize("selection", ["preserve", "random"])
def test_same_input_same_output_bytes(replay_files, selection):
    """Two replays of the same capture with the same config produce
    byte-identical output captures and identical reports."""
    frames = _mixed_frames(random.Random(7))
    cfg = h.make_config(pool=[POOL28], nat={"port_selection": selection, "seed": 99})
    p1, d1 = replay_files(cfg, frames)
    p2, d2 = replay_files(cfg, frames)
    assert p1.returncode == 0 and p2.returncode == 0, h.proc_text(p1) + h.proc_text(p2)
    o1, o2 = (d1 / "out.pcapng").read_bytes(), (d2 / "out.pcapng").read_bytes()
    assert o1 == o2, "same input and config gave different output captures"
    assert (d1 / "r.json").read_text() == (d2 / "r.json").read_text(), "reports differ"
    outs = h.decode_outputs(h.check_output_capture(d1 / "out.pcapng"))
    assert len(outs) >= 60, "precondition: the flows were translated"


def test_example_capture_is_deterministic(tmp_path, natrix):
    """The shipped example (examples/subscribers.pcapng, 12k frames, 200
    subscribers) replayed twice gives the same bytes; every output frame's
    checksums verify and the report's packet counters add up (contract)."""
    cap, cfg = REPO / "examples" / "subscribers.pcapng", REPO / "examples" / "natrix.toml"
    if not cap.exists() or not cfg.exists():
        pytest.skip("example capture not present")
    outs = []
    for i in range(2):
        out = tmp_path / f"ex{i}.pcapng"
        rep = tmp_path / f"ex{i}.json"
        p = natrix("replay", "--config", cfg, "--in", cap, "--out", out, "--report", rep, "--quiet")
        assert p.returncode == 0, h.proc_text(p)
        outs.append((out.read_bytes(), rep.read_text()))
    assert outs[0][0] == outs[1][0], "example replay output differs between two runs"
    assert outs[0][1] == outs[1][1], "example replay report differs between two runs"
    # every emitted frame of the example has valid checksums, and the report adds up
    recs = h.check_output_capture(tmp_path / "ex0.pcapng")
    for i, (_ts, side, raw) in enumerate(recs):
        h.verify_frame_checksums(raw, where=f"example output frame #{i} ({side})")
    h.verify_output_fragments([(side, raw) for _, side, raw in recs])
    import json
    pk = json.loads(outs[0][1])["packets"]
    assert pk["out"] == len(recs), pk
    assert pk["in"] == pk["out"] - pk["generated"] + pk["dropped"], pk


def test_seed_drives_random_port_selection(replay):
    """Contract: with port_selection = "random" ports are chosen
    pseudo-randomly from `seed`: seeds 1 and 2 give different external ports
    for 24 flows (the chance that 24 random parity-kept choices all coincide is
    nil), while each run keeps parity and range."""
    frames = [(T0 + i * 0.01, "inside", h.udp_out("100.64.2.10", 30000 + i, SRV1, 53, b"p%d" % i))
              for i in range(24)]
    ports = {}
    for seed in (1, 2):
        cfg = h.make_config(nat={"port_selection": "random", "seed": seed})
        outs, _ = replay(cfg, frames)
        ports[seed] = [one(outs, "outside", has_payload(b"p%d" % i)).pkt[UDP].sport for i in range(24)]
        for i, p in enumerate(ports[seed]):
            assert p % 2 == (30000 + i) % 2 and 1024 <= p <= 65535
    assert ports[1] != ports[2], "different seeds gave the same 'random' ports: the seed is not used"
