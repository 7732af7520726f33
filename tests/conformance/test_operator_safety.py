"""Operator safety (issue 16, items 1, 3, 4, 5, 6 and 7), tested from the
user's side: exit statuses, messages, and the files before and after.

1. `natrix replay` never destroys its input: an output (`--out`, `--report`,
   `[logging] json`) that is the input, or another output (same device and
   inode, through hard links, symbolic links or two spellings of a path), is
   refused with exit 2 before anything is opened for writing; outputs are
   written to a temporary file in the same folder and renamed at the end, so
   a replay that fails midway leaves no (or the previous) file under the
   requested name and no temporary file; the report path is checked first.
3. A truncated capture (cut inside its last record) is a warning ("truncated
   after frame N", "byte offset B"), not an error; the report says
   `"input_truncated": {"after_frame": N, "byte_offset": B}` (null when whole).
4. `natrix whois --log` skips unreadable lines of a damaged log with a warning
   counting them; exit 0 found, 1 nobody, 2 usage or input errors.
5. `check-config` reports the memory reserved up front; `replay` refuses,
   cleanly, a `max_sessions` whose memory cannot be had.
6. Log records lost by the export sinks are reported (stderr warning even
   with --quiet, `log_export` in the report).
7. `check-config` as a preflight: contradictions between keys, what `run`
   needs (`--live`), "did you mean" and keys in the wrong section.
"""

import json
import os
import re
import resource
import shutil
import socket
import struct
import subprocess
from pathlib import Path

import pytest

import natrix_harness as h
from natrix_harness import POOL1, SRV1, SUB_A, SUB_B, SUB_C, T0

MINIMAL = '[nat]\npool = ["203.0.113.1/32"]\n'


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def frames(n, t0=T0, tag="f"):
    """n UDP frames from SUB_A, each a new flow with payload f"{tag}{i}"."""
    return [(t0 + i * 0.01, "inside", h.udp_out(SUB_A, 40000 + 2 * i, SRV1, 53, f"{tag}{i}".encode()))
            for i in range(n)]


def text(proc):
    return h.proc_text(proc)


def err(proc):
    return proc.stderr.decode(errors="replace")


def run(binary, args, cwd=None, preexec_fn=None, timeout=120):
    return subprocess.run([str(binary)] + [str(a) for a in args], capture_output=True, cwd=cwd,
                          preexec_fn=preexec_fn, timeout=timeout)


def listing(d):
    return sorted(p.name for p in Path(d).iterdir())


def snapshot(d):
    """{name: bytes} of every regular file in folder d (links followed)."""
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}


def pcapng_blocks(data):
    """[(offset, type, total_length)] of a little-endian pcapng file."""
    pos, res = 0, []
    while pos + 12 <= len(data):
        btype, blen = struct.unpack("<II", data[pos:pos + 8])
        res.append((pos, btype, blen))
        pos += blen
    assert pos == len(data)
    return res


def setup_dir(tmp_path, n=5, cfg_text=MINIMAL):
    d = tmp_path / "w"
    d.mkdir()
    (d / "c.toml").write_text(cfg_text)
    h.write_pcapng(d / "in.pcapng", frames(n))
    return d


def outside_payloads(path):
    outs = h.decode_outputs(h.check_output_capture(path))
    return [h.l4_data(o.pkt) for o in outs if o.side == "outside"]


def free_udp_ports(n):
    """n distinct UDP ports on 127.0.0.1 with nobody listening."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _write(tmp_path, content, name="c.toml"):
    p = tmp_path / name
    p.write_text(content)
    return p


# ---------------------------------------------------------------------------
# 1. An output that is the input is refused; outputs are replaced atomically
# ---------------------------------------------------------------------------

# (id, how --in and --out are spelt, relative to the work folder d; a setup
# step may create links). All name the same file as the input.
def _same_file_cases():
    def same(d):
        return d / "in.pcapng", d / "in.pcapng"

    def dot(d):
        return "in.pcapng", "./in.pcapng"        # run with cwd = d

    def abs_rel(d):
        return d / "in.pcapng", "in.pcapng"      # run with cwd = d

    def dotdot(d):
        (d / "sub").mkdir()
        return d / "in.pcapng", d / "sub" / ".." / "in.pcapng"

    def hardlink(d):
        os.link(d / "in.pcapng", d / "hard.pcapng")
        return d / "in.pcapng", d / "hard.pcapng"

    def symlink_out(d):
        os.symlink(d / "in.pcapng", d / "link.pcapng")
        return d / "in.pcapng", d / "link.pcapng"

    def symlink_in(d):
        os.symlink("in.pcapng", d / "link.pcapng")  # relative link target
        return d / "link.pcapng", d / "in.pcapng"

    def symlinked_dir(d):
        os.symlink(d, d.parent / "alias")
        return d / "in.pcapng", d.parent / "alias" / "in.pcapng"

    return [("same-path", same), ("dot-slash", dot), ("absolute-and-relative", abs_rel),
            ("dot-dot", dotdot), ("hard-link", hardlink), ("symlink-as-out", symlink_out),
            ("symlink-as-in", symlink_in), ("through-symlinked-folder", symlinked_dir)]


@pytest.mark.parametrize("case", _same_file_cases(), ids=[c[0] for c in _same_file_cases()])
def test_out_that_is_the_input_is_refused(natrix_bin, tmp_path, case):
    _, spell = case
    d = setup_dir(tmp_path)
    before_in = (d / "in.pcapng").read_bytes()
    inp, out = spell(d)
    names_before = listing(d)
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", inp, "--out", out,
                         "--report", tmp_path / "r.json", "--quiet"], cwd=d)
    e = err(p)
    assert p.returncode == 2, f"--in {inp} --out {out}: exit {p.returncode}, expected 2\n{text(p)}"
    assert "--out" in e and "same file" in e.lower(), f"message must name --out and say 'same file':\n{e}"
    assert (d / "in.pcapng").read_bytes() == before_in, "the input was modified"
    assert listing(d) == names_before, f"files appeared or vanished: {names_before} -> {listing(d)}"
    assert not (tmp_path / "r.json").exists(), "refused before anything is written, the report included"


def test_report_that_is_the_input_is_refused(natrix_bin, tmp_path):
    d = setup_dir(tmp_path)
    before = (d / "in.pcapng").read_bytes()
    os.link(d / "in.pcapng", d / "alias.json")
    for rep in (d / "in.pcapng", "./in.pcapng", d / "alias.json"):
        p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", "in.pcapng",
                             "--out", d / "out.pcapng", "--report", rep, "--quiet"], cwd=d)
        e = err(p)
        assert p.returncode == 2, f"--report {rep}: exit {p.returncode}\n{text(p)}"
        assert "--report" in e and "same file" in e.lower(), e
        assert (d / "in.pcapng").read_bytes() == before, f"--report {rep}: the input was modified"
        assert not (d / "out.pcapng").exists(), "refused before anything is opened for writing: no --out file"


def test_report_that_is_the_existing_out_is_refused(natrix_bin, tmp_path):
    d = setup_dir(tmp_path)
    (d / "out.pcapng").write_bytes(b"previous output")
    os.symlink(d / "out.pcapng", d / "r.json")
    for rep in (d / "out.pcapng", "./out.pcapng", d / "r.json"):
        p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                             "--out", "out.pcapng", "--report", rep, "--quiet"], cwd=d)
        e = err(p)
        assert p.returncode == 2, f"--report {rep}: exit {p.returncode}\n{text(p)}"
        assert "--report" in e and "same file" in e.lower(), e
        assert (d / "out.pcapng").read_bytes() == b"previous output"


@pytest.mark.parametrize("spelling", ["o.pcapng", "./o.pcapng"])
def test_report_that_is_the_new_out_is_refused(natrix_bin, tmp_path, spelling):
    """--out does not exist yet: the report naming the same path (two
    spellings of it) would still overwrite the capture natrix writes."""
    d = setup_dir(tmp_path)
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                         "--out", "o.pcapng", "--report", spelling, "--quiet"], cwd=d)
    e = err(p)
    assert p.returncode == 2, f"exit {p.returncode}\n{text(p)}"
    assert "--report" in e and "same file" in e.lower(), e
    assert not (d / "o.pcapng").exists()


@pytest.mark.parametrize("target", ["input", "input-hardlink", "out", "report"])
def test_json_log_that_is_the_input_or_an_output_is_refused(natrix_bin, tmp_path, target):
    d = setup_dir(tmp_path)
    (d / "out.pcapng").write_bytes(b"previous output")
    (d / "r.json").write_bytes(b'{"previous": true}')
    if target == "input-hardlink":
        os.link(d / "in.pcapng", d / "events.jsonl")
    path = {"input": d / "in.pcapng", "input-hardlink": d / "events.jsonl",
            "out": d / "out.pcapng", "report": d / "r.json"}[target]
    (d / "c.toml").write_text(MINIMAL + f"[logging]\njson = {json.dumps(str(path))}\n")
    before = snapshot(d)
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                         "--out", d / "out.pcapng", "--report", d / "r.json", "--quiet"], cwd=d)
    e = err(p)
    assert p.returncode == 2, f"[logging] json = {path}: exit {p.returncode}\n{text(p)}"
    assert "json" in e and "same file" in e.lower(), f"message must name logging.json and say 'same file':\n{e}"
    assert snapshot(d) == before, "refused before anything is opened for writing: every file unchanged"


def test_json_log_that_is_the_new_out_is_refused(natrix_bin, tmp_path):
    d = setup_dir(tmp_path)
    (d / "c.toml").write_text(MINIMAL + '[logging]\njson = "o.pcapng"\n')
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                         "--out", "./o.pcapng", "--quiet"], cwd=d)
    e = err(p)
    assert p.returncode == 2, f"exit {p.returncode}\n{text(p)}"
    assert "json" in e and "same file" in e.lower(), e
    assert not (d / "o.pcapng").exists()


def test_distinct_outputs_are_accepted_and_leave_no_temporary_files(natrix_bin, tmp_path):
    """Control: distinct paths work; an existing --out is replaced; the
    output folder holds exactly the requested files afterwards."""
    d = setup_dir(tmp_path)
    od = tmp_path / "o"
    od.mkdir()
    (od / "out.pcapng").write_bytes(b"previous output")
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                         "--out", od / "out.pcapng", "--report", od / "r.json", "--quiet"])
    assert p.returncode == 0, text(p)
    assert listing(od) == ["out.pcapng", "r.json"], listing(od)
    assert outside_payloads(od / "out.pcapng") == [f"f{i}".encode() for i in range(5)]
    assert json.loads((od / "r.json").read_text())["packets"]["in"] == 5


def _corrupt_input(path, n_frames, after, kind):
    """A pcapng of n_frames frames with a corrupt block inserted after the
    first `after` packet blocks; valid blocks follow it, so it is not a
    truncation."""
    h.write_pcapng(path, frames(n_frames))
    data = path.read_bytes()
    epbs = [off for off, btype, _ in pcapng_blocks(data) if btype == h.EPB_TYPE]
    at = epbs[after]
    if kind == "length-below-minimum":
        bad = struct.pack("<II", h.EPB_TYPE, 8)
    else:  # "length-mismatch": leading and trailing lengths differ, caplen beyond the block
        bad = struct.pack("<II", h.EPB_TYPE, 32) + struct.pack("<IIIII", 0, 0, 0, 0xFFFF, 0xFFFF) \
            + struct.pack("<I", 0xDEADBEEF)
    path.write_bytes(data[:at] + bad + data[at:])


@pytest.mark.parametrize("after", [1, 400], ids=["second-packet-block", "after-400-frames"])
@pytest.mark.parametrize("kind", ["length-below-minimum", "length-mismatch"])
@pytest.mark.parametrize("existing", [False, True], ids=["no-previous-out", "previous-out"])
def test_failed_replay_leaves_no_partial_output(natrix_bin, tmp_path, after, kind, existing):
    """Every output (--out, --report and the [logging] json log) is written
    to a temporary file and renamed at the end: a replay that fails midway
    leaves the output folder exactly as it was."""
    inp = tmp_path / "in.pcapng"
    _corrupt_input(inp, after + 50, after, kind)
    od = tmp_path / "o"
    od.mkdir()
    (tmp_path / "c.toml").write_text(MINIMAL + f"[logging]\njson = {json.dumps(str(od / 'events.jsonl'))}\n")
    if existing:
        (od / "out.pcapng").write_bytes(b"previous output")
        (od / "r.json").write_bytes(b'{"previous": true}')
        (od / "events.jsonl").write_bytes(b'{"previous": "log"}\n')
    before = snapshot(od)
    p = run(natrix_bin, ["replay", "--config", tmp_path / "c.toml", "--in", inp,
                         "--out", od / "out.pcapng", "--report", od / "r.json", "--quiet"])
    assert p.returncode > 0, f"a corrupt capture must fail (exit {p.returncode}, not 0 or a signal)\n{text(p)}"
    assert err(p).strip(), "no message"
    after_ = snapshot(od)
    changed = sorted(k for k in set(before) | set(after_) if before.get(k) != after_.get(k))
    assert not changed, (
        f"a failed replay must leave the output folder as it was; changed or new: {changed}\n{text(p)}")


@pytest.mark.parametrize("where", ["missing-folder", "parent-is-a-file", "is-a-folder"])
def test_unwritable_report_path_fails_before_the_replay(natrix_bin, tmp_path, where):
    d = setup_dir(tmp_path)
    if where == "missing-folder":
        rep = tmp_path / "nonexistent-dir" / "r.json"
    elif where == "parent-is-a-file":
        rep = d / "c.toml" / "r.json"
    else:
        rep = tmp_path / "a-folder"
        rep.mkdir()
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                         "--out", d / "out.pcapng", "--report", rep, "--quiet"])
    assert p.returncode > 0, text(p)
    assert str(rep) in err(p), f"the message must name the report path {rep}:\n{err(p)}"
    assert not (d / "out.pcapng").exists(), "checked before the replay starts: no --out file"
    assert listing(d) == ["c.toml", "in.pcapng"], listing(d)


# ---------------------------------------------------------------------------
# 3. A truncated capture is a warning, not an error
# ---------------------------------------------------------------------------

K = 6  # frames written; the last one is cut


def _pcapng_cut(path, cut):
    h.write_pcapng(path, frames(K))
    data = path.read_bytes()
    off, btype, blen = pcapng_blocks(data)[-1]
    assert btype == h.EPB_TYPE
    assert 0 < cut < blen
    path.write_bytes(data[:off + cut])
    return off


def _pcap_cut(path, cut):
    fr = frames(K)
    h.write_pcap(path, fr)
    data = path.read_bytes()
    off = 24 + sum(16 + len(bytes(p)) for _, _, p in fr[:-1])
    rec = 16 + len(bytes(fr[-1][2]))
    assert off + rec == len(data) and 0 < cut < rec
    path.write_bytes(data[:off + cut])
    return off


# cut = how many bytes of the last record remain: inside the record header,
# right after it, inside the frame, one byte short.
PCAPNG_CUTS = [1, 4, 8, 20, 28, 40, "last-1"]
PCAP_CUTS = [1, 8, 15, 16, 30, "last-1"]


def _resolve(cut, fmt):
    if cut != "last-1":
        return cut
    last = len(bytes(frames(K)[-1][2]))
    return (28 + ((last + 3) // 4) * 4 + 4 if fmt == "pcapng" else 16 + last) - 1


def _check_truncated_run(p, d, off):
    n = K - 1
    e = err(p)
    assert p.returncode == 0, f"a truncated capture is not an error (exit {p.returncode})\n{text(p)}"
    assert f"truncated after frame {n}" in e, f"warning must say 'truncated after frame {n}':\n{e}"
    assert f"byte offset {off}" in e, f"warning must say 'byte offset {off}':\n{e}"
    assert outside_payloads(d / "out.pcapng") == [f"f{i}".encode() for i in range(n)], \
        "every complete frame is translated"
    rep = json.loads((d / "r.json").read_text())
    assert rep["packets"]["in"] == n, rep["packets"]
    assert rep.get("input_truncated") == {"after_frame": n, "byte_offset": off}, rep.get("input_truncated")


@pytest.mark.parametrize("fmt,cut", [("pcapng", c) for c in PCAPNG_CUTS] + [("pcap", c) for c in PCAP_CUTS])
def test_truncated_capture_is_a_warning(natrix_bin, tmp_path, fmt, cut):
    d = tmp_path
    (d / "c.toml").write_text(MINIMAL)
    inp = d / f"in.{fmt}"
    off = (_pcapng_cut if fmt == "pcapng" else _pcap_cut)(inp, _resolve(cut, fmt))
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", inp, "--out", d / "out.pcapng",
                         "--report", d / "r.json", "--quiet"])
    _check_truncated_run(p, d, off)


@pytest.mark.parametrize("fmt", ["pcapng", "pcap"])
def test_truncated_capture_still_prints_the_summary(natrix_bin, tmp_path, fmt):
    d = tmp_path
    (d / "c.toml").write_text(MINIMAL)
    inp = d / f"in.{fmt}"
    off = (_pcapng_cut if fmt == "pcapng" else _pcap_cut)(inp, 10)
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", inp, "--out", d / "out.pcapng",
                         "--report", d / "r.json"])
    _check_truncated_run(p, d, off)
    # The same replay with --quiet prints no summary: what the plain run adds
    # on stdout is the summary.
    q = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", inp, "--out", d / "out2.pcapng", "--quiet"])
    assert q.returncode == 0, text(q)
    assert p.stdout.strip() and len(p.stdout) > len(q.stdout), f"no summary without --quiet:\n{text(p)}"


@pytest.mark.parametrize("fmt", ["pcapng", "pcap"])
def test_capture_whose_only_record_is_cut_replays_nothing_and_says_so(natrix_bin, tmp_path, fmt):
    d = tmp_path
    (d / "c.toml").write_text(MINIMAL)
    inp = d / f"in.{fmt}"
    (h.write_pcapng if fmt == "pcapng" else h.write_pcap)(inp, frames(1))
    data = inp.read_bytes()
    off = pcapng_blocks(data)[-1][0] if fmt == "pcapng" else 24
    inp.write_bytes(data[:-10])
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", inp, "--out", d / "out.pcapng",
                         "--report", d / "r.json", "--quiet"])
    assert p.returncode == 0, text(p)
    assert "truncated after frame 0" in err(p) and f"byte offset {off}" in err(p), err(p)
    assert outside_payloads(d / "out.pcapng") == []
    rep = json.loads((d / "r.json").read_text())
    assert rep["input_truncated"] == {"after_frame": 0, "byte_offset": off}, rep["input_truncated"]


@pytest.mark.parametrize("fmt", ["pcapng", "pcap"])
def test_complete_capture_reports_input_truncated_null(natrix_bin, tmp_path, fmt):
    d = tmp_path
    (d / "c.toml").write_text(MINIMAL)
    inp = d / f"in.{fmt}"
    (h.write_pcapng if fmt == "pcapng" else h.write_pcap)(inp, frames(K))
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", inp, "--out", d / "out.pcapng",
                         "--report", d / "r.json", "--quiet"])
    assert p.returncode == 0, text(p)
    assert "truncated" not in err(p), err(p)
    rep = json.loads((d / "r.json").read_text())
    assert "input_truncated" in rep and rep["input_truncated"] is None, rep.get("input_truncated", "absent")


# ---------------------------------------------------------------------------
# 4. whois on a damaged log
# ---------------------------------------------------------------------------


@pytest.fixture
def event_log(tmp_path):
    """A real JSON event log: SUB_A, SUB_B and SUB_C each create one UDP
    mapping on POOL1 (ports 40000, 41000, 42000 preserved) at T0, T0+1, T0+2."""
    log = tmp_path / "events.jsonl"
    cfg = h.make_config() + f"[logging]\njson = {json.dumps(str(log))}\n"
    fr = [(T0, "inside", h.udp_out(SUB_A, 40000, SRV1, 53, b"a")),
          (T0 + 1, "inside", h.udp_out(SUB_B, 41000, SRV1, 53, b"b")),
          (T0 + 2, "inside", h.udp_out(SUB_C, 42000, SRV1, 53, b"c"))]
    outs, _ = h.run_replay(cfg, fr, tmp_path)
    for payload, port in ((b"a", 40000), (b"b", 41000), (b"c", 42000)):
        p = h.one(outs, "outside", h.has_payload(payload)).pkt
        assert (p[h.IP].src, p[h.UDP].sport) == (POOL1, port)
    lines = log.read_text().splitlines(keepends=True)
    assert len(lines) == 3, lines
    return log, lines


def whois(natrix, *args):
    return natrix("whois", *args)


AT = str(T0 + 10)

DAMAGE = {
    # a crash mid-write: the last line is cut in half (no newline)
    "torn-last-line": lambda ls: ls[:2] + [ls[2][:len(ls[2]) // 2]],
    # a full disk / crash: NUL bytes where the last line should be
    "nul-last-line": lambda ls: ls[:2] + ["\x00" * 60],
    # garbage in the middle
    "garbage-middle": lambda ls: ls[:1] + ["this is not json {\n"] + ls[1:],
    # a line cut short followed by the next record (a torn write, then appends resumed)
    "torn-middle": lambda ls: ls[:1] + [ls[1][:30] + "\n"] + ls[1:],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_whois_skips_one_unreadable_line_with_a_warning(natrix, event_log, damage):
    log, lines = event_log
    log.write_text("".join(DAMAGE[damage](lines)))
    # SUB_A's record is intact in every variant (the first line).
    p = whois(natrix, f"{POOL1}:40000", "--at", AT, "--log", log)
    assert p.returncode == 0, text(p)
    assert SUB_A in p.stdout.decode(), text(p)
    e = err(p)
    assert "warning" in e.lower() and "skipped 1 unreadable line" in e, f"expected a warning counting 1 line:\n{e}"
    if damage in ("garbage-middle", "torn-middle"):
        # the records after the damage are still read
        q = whois(natrix, f"{POOL1}:42000", "--at", AT, "--log", log)
        assert q.returncode == 0 and SUB_C in q.stdout.decode(), text(q)


def test_whois_counts_every_unreadable_line(natrix, event_log):
    log, lines = event_log
    log.write_text(lines[0] + "garbage\n" + lines[1] + "\x00\x00\x00\n" + lines[2][:25])
    p = whois(natrix, f"{POOL1}:41000", "--at", AT, "--log", log)
    assert p.returncode == 0 and SUB_B in p.stdout.decode(), text(p)
    assert "skipped 3 unreadable line" in err(p), err(p)  # "lines" or "line(s)"


def test_whois_on_a_damaged_log_still_says_nobody_with_exit_1(natrix, event_log):
    log, lines = event_log
    log.write_text("".join(DAMAGE["torn-last-line"](lines)))
    p = whois(natrix, f"{POOL1}:50000", "--at", AT, "--log", log)
    assert p.returncode == 1, text(p)
    assert "nobody" in text(p).lower(), text(p)
    assert "skipped 1 unreadable line" in err(p), err(p)


def test_whois_json_on_a_damaged_log_keeps_stdout_json(natrix, event_log):
    log, lines = event_log
    log.write_text("".join(DAMAGE["garbage-middle"](lines)))
    p = whois(natrix, f"{POOL1}:41000", "--at", AT, "--log", log, "--json")
    assert p.returncode == 0, text(p)
    doc = json.loads(p.stdout.decode())  # the warning goes to stderr only
    assert doc["held"] is True and doc["answers"][0]["subscriber"] == SUB_B, doc
    assert "skipped 1 unreadable line" in err(p), err(p)


def test_whois_on_an_intact_log_warns_about_nothing(natrix, event_log):
    log, _ = event_log
    p = whois(natrix, f"{POOL1}:40000", "--at", AT, "--log", log)
    assert p.returncode == 0 and SUB_A in p.stdout.decode(), text(p)
    assert "skipped" not in err(p) and "warning" not in err(p).lower(), err(p)


@pytest.mark.parametrize("args", [
    pytest.param(lambda log: [f"{POOL1}:40000", "--log", log.parent / "no-such.jsonl"], id="missing-log"),
    pytest.param(lambda log: [POOL1, "--log", log], id="no-port"),
    pytest.param(lambda log: [f"{POOL1}:99999", "--log", log], id="port-out-of-range"),
    pytest.param(lambda log: ["not-an-address:80", "--log", log], id="bad-address"),
    pytest.param(lambda log: ["203.0.113.300:80", "--log", log], id="bad-octet"),
    pytest.param(lambda log: [f"{POOL1}:40000", "--at", "yesterday", "--log", log], id="bad-at"),
    pytest.param(lambda log: [f"{POOL1}:40000", "--at", "2026-13-45T99:00:00Z", "--log", log], id="bad-at-date"),
])
def test_whois_usage_and_input_errors_exit_2(natrix, event_log, args):
    log, _ = event_log
    p = whois(natrix, *args(log))
    assert p.returncode == 2, f"exit {p.returncode}, expected 2\n{text(p)}"
    assert err(p).strip(), "no message"
    assert "nobody" not in text(p).lower(), text(p)


# ---------------------------------------------------------------------------
# 5. Memory reserved up front
# ---------------------------------------------------------------------------

MAX_SESSIONS = 268435456
UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 1000, "kib": 1024, "mb": 1000 ** 2, "mib": 1024 ** 2,
         "gb": 1000 ** 3, "gib": 1024 ** 3, "tb": 1000 ** 4, "tib": 1024 ** 4}


def memory_figure(stdout):
    """The largest byte figure on the stdout line(s) that mention memory."""
    lines = [ln for ln in stdout.splitlines() if "memory" in ln.lower()]
    assert lines, f"check-config printed no line about memory on stdout:\n{stdout}"
    best = None
    for ln in lines:
        for num, unit in re.findall(r"(\d[\d,_]*(?:\.\d+)?)\s*(TiB|GiB|MiB|KiB|TB|GB|MB|kB|KB|bytes|byte|B)\b", ln):
            v = float(num.replace(",", "").replace("_", "")) * UNITS[unit.lower()]
            best = v if best is None else max(best, v)
    assert best is not None, f"no byte/MiB/GiB figure on the memory line: {lines}"
    return best


def test_check_config_reports_the_memory_reserved(natrix, tmp_path):
    small = tmp_path / "small.toml"
    big = tmp_path / "big.toml"
    small.write_text(MINIMAL + f"max_sessions = {MAX_SESSIONS // 4}\n")
    big.write_text(MINIMAL + f"max_sessions = {MAX_SESSIONS}\n")
    ps, pb = natrix("check-config", small), natrix("check-config", big)
    assert ps.returncode == 0, text(ps)
    assert pb.returncode == 0, f"max_sessions = {MAX_SESSIONS} is the maximum accepted\n{text(pb)}"
    ms, mb = memory_figure(ps.stdout.decode()), memory_figure(pb.stdout.decode())
    assert mb > ms, f"4x max_sessions must report more memory: {ms} -> {mb}"
    assert mb >= MAX_SESSIONS, f"{MAX_SESSIONS} sessions cannot fit in {mb} bytes"


def test_max_sessions_beyond_the_maximum_is_refused(natrix, tmp_path):
    p = natrix("check-config", _write(tmp_path, MINIMAL + f"max_sessions = {MAX_SESSIONS + 1}\n"))
    assert p.returncode == 2 and "max_sessions" in text(p), text(p)


AS_LIMIT = 2_000_000_000


def _limit_as():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def test_replay_refuses_cleanly_when_the_session_table_memory_cannot_be_had(natrix_bin, tmp_path):
    d = setup_dir(tmp_path, cfg_text=MINIMAL + f"max_sessions = {MAX_SESSIONS}\n")
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                         "--out", d / "out.pcapng", "--report", d / "r.json", "--quiet"], preexec_fn=_limit_as)
    t = text(p)
    assert p.returncode in (1, 2), f"exit {p.returncode} (a negative status is a signal, e.g. abort)\n{t}"
    assert "memory" in err(p).lower() and "max_sessions" in err(p), f"the message must name memory and max_sessions:\n{t}"
    assert "panicked" not in t and "backtrace" not in t.lower(), t
    assert not (d / "out.pcapng").exists() and not (d / "r.json").exists()


def test_replay_with_default_max_sessions_runs_under_the_same_limit(natrix_bin, tmp_path):
    """Control: the address-space limit above is not what makes replay fail."""
    d = setup_dir(tmp_path)
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                         "--out", d / "out.pcapng", "--quiet"], preexec_fn=_limit_as)
    assert p.returncode == 0, text(p)


# ---------------------------------------------------------------------------
# 6. Lost log records are reported
# ---------------------------------------------------------------------------

N_FLOWS = 3000


@pytest.fixture(scope="module")
def many_flows_capture(tmp_path_factory):
    """N_FLOWS UDP flows (30 subscribers x 100 ports): N_FLOWS mappings."""
    path = tmp_path_factory.mktemp("flows") / "in.pcapng"
    base = h.udp_out(SUB_A, 40000, SRV1, 53, b"x")
    fr = []
    for i in range(N_FLOWS):
        sub, k = divmod(i, 100)
        src = f"100.64.1.{sub + 1}"
        p = base.copy()
        p[h.Ether].src = h.mac_for(src)
        p[h.IP].src = src
        p[h.UDP].sport = 20000 + 2 * k
        del p[h.IP].chksum
        del p[h.UDP].chksum
        fr.append((T0 + i * 0.001, "inside", p))
    h.write_pcapng(path, fr)
    return path


def _replay_logging(natrix_bin, tmp_path, capture, logging):
    cfg = tmp_path / "c.toml"
    cfg.write_text(MINIMAL + "[logging]\n" + logging if logging else MINIMAL)
    p = run(natrix_bin, ["replay", "--config", cfg, "--in", capture, "--out", tmp_path / "out.pcapng",
                         "--report", tmp_path / "r.json", "--quiet"])
    assert p.returncode == 0, f"lost log records are not a replay failure\n{text(p)}"
    return p, json.loads((tmp_path / "r.json").read_text())


def test_records_lost_to_unreachable_collectors_are_reported(natrix_bin, tmp_path, many_flows_capture):
    log = tmp_path / "events.jsonl"
    ip_port, sys_port = free_udp_ports(2)
    p, rep = _replay_logging(natrix_bin, tmp_path, many_flows_capture,
                             f'json = {json.dumps(str(log))}\nipfix = "127.0.0.1:{ip_port}"\n'
                             f'syslog = "udp:127.0.0.1:{sys_port}"\n')
    assert rep["mappings_created"] == N_FLOWS
    assert "lost" in err(p), f"a warning about lost records is printed even with --quiet:\n{text(p)}"
    exp = rep.get("log_export")
    assert isinstance(exp, dict) and set(exp) == {"json", "ipfix", "syslog"}, exp
    for sink in ("ipfix", "syslog"):
        assert isinstance(exp[sink].get("sent"), int) and isinstance(exp[sink].get("lost"), int), exp
        assert exp[sink]["lost"] > 0, f"{sink} to a closed port must count lost records: {exp}"
    n = len(log.read_text().splitlines())
    assert n >= N_FLOWS
    assert exp["json"] == {"sent": n, "lost": 0}, exp


def test_json_sink_alone_loses_nothing(natrix_bin, tmp_path, many_flows_capture):
    log = tmp_path / "events.jsonl"
    p, rep = _replay_logging(natrix_bin, tmp_path, many_flows_capture, f"json = {json.dumps(str(log))}\n")
    n = len(log.read_text().splitlines())
    assert rep.get("log_export") == {"json": {"sent": n, "lost": 0}}, rep.get("log_export")
    assert "lost" not in err(p) and "warning" not in err(p).lower(), err(p)


def test_no_logging_sinks_gives_an_empty_log_export(natrix_bin, tmp_path):
    d = setup_dir(tmp_path)
    p = run(natrix_bin, ["replay", "--config", d / "c.toml", "--in", d / "in.pcapng",
                         "--out", d / "out.pcapng", "--report", d / "r.json", "--quiet"])
    assert p.returncode == 0, text(p)
    rep = json.loads((d / "r.json").read_text())
    assert "log_export" in rep and rep["log_export"] == {}, rep.get("log_export", "absent")


# ---------------------------------------------------------------------------
# 7. check-config as a preflight
# ---------------------------------------------------------------------------


def _mtu(name):
    try:
        return int(Path(f"/sys/class/net/{name}/mtu").read_text())
    except (OSError, ValueError):
        return None


def _two_interfaces():
    """Two interfaces that exist here (for --live checks that might look
    them up) with an MTU natrix takes (no jumbo frames), else the README's
    eth1/eth2."""
    try:
        names = sorted(n for n in os.listdir("/sys/class/net") if n != "lo" and (_mtu(n) or 0) <= 2034)
    except OSError:
        names = []
    return tuple(names[:2]) if len(names) >= 2 else ("eth1", "eth2")


IF_IN, IF_OUT = _two_interfaces()

LIVE = {
    "inside": {"interface": IF_IN, "address": "100.64.0.1/10"},
    "outside": {"interface": IF_OUT, "address": "198.51.100.1/24", "gateway": "198.51.100.254"},
    "nat": {"pool": ["203.0.113.0/28", "198.51.100.10/32"]},
}


def live_config(drop=(), **sections):
    """LIVE with keys removed (drop: "section.key") and sections updated."""
    cfg = {s: dict(v) for s, v in LIVE.items()}
    for s, v in sections.items():
        cfg.setdefault(s, {}).update(v)
    for dotted in drop:
        s, k = dotted.split(".")
        del cfg[s][k]
    out = []
    for s, kv in cfg.items():
        if kv:
            out.append(f"[{s}]")
            out += [f"{k} = {h._toml_value(v)}" for k, v in kv.items()]
    return "\n".join(out) + "\n"


CONTRADICTIONS = [
    ("pool-overlaps-inside",
     '[inside]\naddress = "100.64.0.1/10"\n[nat]\npool = ["100.64.5.0/28"]\n',
     ("nat.pool", "inside.address")),
    ("pool-contains-outside-address",
     '[outside]\naddress = "198.51.100.1/24"\n[nat]\npool = ["198.51.100.0/28"]\n',
     ("nat.pool", "outside.address")),
    ("inside-overlaps-outside",
     '[inside]\naddress = "10.0.0.1/16"\n[outside]\naddress = "10.0.5.1/24"\n[nat]\npool = ["203.0.113.0/28"]\n',
     ("inside.address", "outside.address")),
    ("same-interface-both-sides",
     '[inside]\ninterface = "eth1"\n[outside]\ninterface = "eth1"\n[nat]\npool = ["203.0.113.0/28"]\n',
     ("inside.interface", "outside.interface")),
    ("gateway-off-the-outside-prefix",
     '[outside]\naddress = "198.51.100.1/24"\ngateway = "192.0.2.1"\n[nat]\npool = ["203.0.113.0/28"]\n',
     ("outside.gateway", "outside.address")),
]


@pytest.mark.parametrize("case,cfg,keys", CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS])
def test_contradictory_keys_are_refused_naming_both(natrix, tmp_path, case, cfg, keys):
    p = natrix("check-config", _write(tmp_path, cfg))
    t = text(p)
    assert p.returncode == 2, f"{case}: exit {p.returncode}, expected 2\n{t}"
    for k in keys:
        assert k in t, f"{case}: the message must name {k}:\n{t}"


def test_consistent_live_config_passes(natrix, tmp_path):
    p = natrix("check-config", _write(tmp_path, live_config()))
    assert p.returncode == 0, text(p)


def test_plain_check_config_warns_about_what_run_needs(natrix, tmp_path):
    p = natrix("check-config", _write(tmp_path, MINIMAL))
    e = err(p)
    assert p.returncode == 0, text(p)
    assert "run" in e, f"the warning must say `natrix run` needs more:\n{e}"
    for k in ("inside.interface", "outside.interface", "outside.gateway", "outside.address"):
        assert k in e, f"the warning must name {k}:\n{e}"


REQUIRED_LIVE = ["inside.interface", "outside.interface", "outside.address", "outside.gateway"]


@pytest.mark.parametrize("key", REQUIRED_LIVE)
def test_live_check_requires_what_run_needs(natrix, tmp_path, key):
    cfg = _write(tmp_path, live_config(drop=[key]))
    plain = natrix("check-config", cfg)
    if key == "outside.address":
        # outside.gateway is still set and cannot be checked against the
        # outside prefix: plain check-config may refuse that too.
        assert plain.returncode in (0, 2) and key in text(plain), text(plain)
    else:
        assert plain.returncode == 0, text(plain)
        assert key in err(plain), f"plain check-config must warn that run needs {key}:\n{text(plain)}"
    live = natrix("check-config", "--live", cfg)
    assert live.returncode == 2, f"--live without {key}: exit {live.returncode}\n{text(live)}"
    assert key in text(live), text(live)


def test_live_check_passes_a_complete_config(natrix, tmp_path):
    (tmp_path / "logs").mkdir()
    cfg = _write(tmp_path, live_config(logging={"json": str(tmp_path / "logs" / "events.jsonl")}))
    p = natrix("check-config", "--live", cfg)
    assert p.returncode == 0, text(p)
    assert not (tmp_path / "logs" / "events.jsonl").exists() or \
        (tmp_path / "logs" / "events.jsonl").stat().st_size == 0, "a preflight writes no events"


def test_live_check_refuses_an_interface_with_jumbo_frames(natrix_bin, tmp_path):
    """natrix's frame buffers hold 2,048 bytes: an interface whose MTU allows
    longer frames is refused before `run` (which refuses it too), naming the
    interface and the MTU, rather than dropping or cutting its big frames."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to build a namespace with a veth pair")
    ns = f"nx-jumbo-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        # A veth pair (this kernel may have no dummy interfaces), one end jumbo.
        subprocess.run(["ip", "-n", ns, "link", "add", "nxj-in", "type", "veth", "peer", "name", "nxj-out"], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "nxj-out", "mtu", "9000"], check=True)
        cfg = _write(tmp_path, live_config(inside={"interface": "nxj-in"}, outside={"interface": "nxj-out"}))
        p = subprocess.run(["ip", "netns", "exec", ns, str(natrix_bin), "check-config", "--live", str(cfg)],
                           capture_output=True, text=True, timeout=60)
        t = p.stdout + p.stderr
        assert p.returncode == 2, f"exit {p.returncode}, expected 2:\n{t}"
        assert "outside.interface" in t and "nxj-out" in t and "9000" in t, t
        assert "nxj-in" not in t, f"the 1500-byte interface is fine:\n{t}"
    finally:
        subprocess.run(["ip", "netns", "del", ns])


@pytest.mark.parametrize("where", ["missing-folder", "parent-is-a-file", "read-only-folder"])
def test_live_check_refuses_an_unwritable_json_log(natrix, tmp_path, where):
    if where == "missing-folder":
        path = tmp_path / "no-such-dir" / "events.jsonl"
    elif where == "parent-is-a-file":
        (tmp_path / "afile").write_text("x")
        path = tmp_path / "afile" / "events.jsonl"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes to read-only folders")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        path = ro / "events.jsonl"
    cfg = _write(tmp_path, live_config(logging={"json": str(path)}))
    p = natrix("check-config", "--live", cfg)
    assert p.returncode == 2, f"--live with logging.json = {path}: exit {p.returncode}\n{text(p)}"
    assert "logging.json" in text(p), text(p)
    assert not path.exists()


MISSPELT = [
    (MINIMAL + "max_session = 5\n", "max_session", "max_sessions"),
    (MINIMAL + 'filterin = "address-dependent"\n', "filterin", "filtering"),
    (MINIMAL + 'hold_dwn = "120s"\n', "hold_dwn", "hold_down"),
    (MINIMAL + '[timeouts]\nud = "5m"\n', "ud", "udp"),
    ("worker = 2\n" + MINIMAL, "worker", "workers"),
]


@pytest.mark.parametrize("line,bad,good", MISSPELT, ids=[m[1] for m in MISSPELT])
def test_misspelt_key_gets_did_you_mean(natrix, tmp_path, line, bad, good):
    p = natrix("check-config", _write(tmp_path, line))
    t = text(p)
    assert p.returncode == 2, t
    assert bad in t and "did you mean" in t.lower() and good in t, t


def test_top_level_key_in_a_section_is_named_as_such(natrix, tmp_path):
    p = natrix("check-config", _write(tmp_path, MINIMAL + "workers = 2\n"))
    t = text(p)
    assert p.returncode == 2, t
    assert "workers" in t and "top-level" in t, t


WRONG_SECTION = [
    (MINIMAL + 'gateway = "198.51.100.254"\n', "gateway", "outside"),
    (MINIMAL + 'udp = "5m"\n', "udp", "timeouts"),
    ('[inside]\npool = ["203.0.113.1/32"]\n' + MINIMAL, "pool", "nat"),
    ("max_sessions = 5\n" + MINIMAL, "max_sessions", "nat"),
]


@pytest.mark.parametrize("cfg,key,section", WRONG_SECTION, ids=[f"{w[1]}-belongs-in-{w[2]}" for w in WRONG_SECTION])
def test_key_in_the_wrong_section_names_its_section(natrix, tmp_path, cfg, key, section):
    p = natrix("check-config", _write(tmp_path, cfg))
    t = text(p)
    assert p.returncode == 2, t
    assert key in t and (f"[{section}]" in t or f"{section}.{key}" in t), t


@pytest.mark.parametrize("mode", ["syn-accel", "sctp", "host-id", "dslite"])
def test_bench_refuses_workers_where_it_runs_one(natrix, mode):
    """These modes measure one worker: `--workers 2` would be ignored, and
    the figures read as two workers'. Refused, exit 2, naming the flag."""
    p = natrix("bench", "--mode", mode, "--workers", "2", "--flows", "1000")
    assert p.returncode == 2, f"exit {p.returncode}, expected 2\n{text(p)}"
    assert "--workers" in err(p), text(p)


@pytest.mark.skipif(shutil.which("capinfos") is None or shutil.which("tshark") is None, reason="needs capinfos and tshark (apt-get install -y tshark)")
@pytest.mark.parametrize("name,kind", [("gen.pcap", "nanosecond pcap"), ("gen.pcapng", "pcapng")])
def test_gen_writes_a_classic_pcap_or_a_pcapng_by_the_files_name(natrix, tmp_path, name, kind):
    """CONTRACTS, "Tester": `natrix gen` writes to "a pcap (--out FILE)":
    a classic pcap where the name ends in .pcap, else pcapng, as capinfos
    and tshark read them."""
    out = tmp_path / name
    p = natrix("gen", "--out", out, "--rate", "1000", "--duration", "0.01", "--flows", "4")
    assert p.returncode == 0, text(p)
    info = subprocess.run(["capinfos", "-t", "-c", str(out)], capture_output=True, text=True, timeout=30).stdout
    assert kind in info and re.search(r"Number of packets:\s+10\b", info), info
    frames = subprocess.run(["tshark", "-r", str(out), "-T", "fields", "-e", "udp.dstport"], capture_output=True, text=True, timeout=30).stdout.split()
    assert len(frames) == 10 and set(frames) == {"5001"}, frames
