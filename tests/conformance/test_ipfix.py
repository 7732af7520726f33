"""NAT event export from `natrix replay`: IPFIX (RFC 7011) with the RFC 8158
NAT information elements, and syslog (RFC 5424), both over UDP to a local
socket. The IPFIX datagrams are wrapped in a pcap and decoded by an
independent decoder, tshark's IPFIX (cflow) dissector, and compared record
by record with the JSON event log written in the same replay."""

import ipaddress
import json
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
from datetime import datetime, timezone

import pytest

import natrix_harness as h
from natrix_harness import SRV1, SUB_A, SUB_B, SUB_C, T0

EXAMPLE = h.REPO_ROOT / "examples" / "subscribers.pcapng"
POOL = "203.0.113.0/28"
SUBSCRIBERS = "100.64.0.0/10"
PROTO_NUMBER = {"tcp": 6, "udp": 17, "icmp": 1}

# natEvent values (IANA, RFC 8158)
SESSION_CREATE, SESSION_DELETE = 4, 5
BIB_CREATE, BIB_DELETE = 8, 9
BLOCK_ALLOC, BLOCK_DEALLOC = 16, 17
ADDRESSES_EXHAUSTED, PORTS_EXHAUSTED, QUOTA_EXCEEDED = 3, 12, 13

MAX_MESSAGE = 1400


# ---------------------------------------------------------------------------
# A UDP collector, a pcap writer and the tshark decode
# ---------------------------------------------------------------------------

class Collector:
    """Receives UDP datagrams on 127.0.0.1 in a thread, in arrival order."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for opt in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
            if opt is None:
                continue
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, 16 << 20)
                break
            except OSError:
                continue
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.datagrams = []
        self._last = time.monotonic()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop:
            try:
                self.datagrams.append(self.sock.recv(65535))
                self._last = time.monotonic()
            except socket.timeout:
                pass

    def finish(self, idle=0.3, limit=5.0):
        """Waits until nothing has arrived for `idle` seconds, then stops."""
        end = time.monotonic() + limit
        while time.monotonic() - self._last < idle and time.monotonic() < end:
            time.sleep(0.05)
        self._stop = True
        self._thread.join()
        self.sock.close()
        return self.datagrams


def _ip_checksum(header: bytes) -> int:
    s = sum(struct.unpack("!%dH" % (len(header) // 2), header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def write_pcap(path, datagrams, dport, sport=50000):
    """Classic pcap (Ethernet) of IPv4/UDP frames 127.0.0.1:sport -> :dport."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for i, payload in enumerate(datagrams):
        udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
        ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i & 0xFFFF, 0x4000, 64, 17, 0,
                                   socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.1")))
        ip[10:12] = struct.pack("!H", _ip_checksum(bytes(ip)))
        frame = bytes.fromhex("020000000002020000000001") + b"\x08\x00" + bytes(ip) + udp
        out += struct.pack("<IIII", 1_700_000_000 + i, 0, len(frame), len(frame)) + frame
    path.write_bytes(bytes(out))


def need_tshark():
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed (apt-get install -y tshark): the IPFIX output is checked "
                    "only with an independent decoder, tshark's cflow dissector")


_TSHARK_TIME = re.compile(r"^(\w{3})\s+(\d+), (\d{4}) (\d\d):(\d\d):(\d\d)\.(\d+) UTC$")
_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def tshark_time_ms(text):
    m = _TSHARK_TIME.match(text)
    assert m, f"unexpected tshark time {text!r}"
    mon, day, year, hh, mm, ss, frac = m.groups()
    t = datetime(int(year), _MONTHS.index(mon) + 1, int(day), int(hh), int(mm), int(ss), tzinfo=timezone.utc)
    return int(t.timestamp()) * 1000 + int(frac[:3].ljust(3, "0"))


def json_time_ms(text):
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return round(t.timestamp() * 1000)


def tshark_decode(tmp_path, datagrams, port):
    """-> list of messages as tshark decodes them: dict(seq, export, length,
    templates=[ids], data=[(set id, {field: value})], experts=[messages])."""
    pcap = tmp_path / "ipfix.pcap"
    write_pcap(pcap, datagrams, port)
    proc = subprocess.run(["tshark", "-r", str(pcap), "-d", f"udp.port=={port},cflow", "-T", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    frames = json.loads(proc.stdout)
    assert len(frames) == len(datagrams)
    messages = []
    for f in frames:
        layers = f["_source"]["layers"]
        assert "cflow" in layers, f"tshark did not decode frame {layers['frame']['frame.number']} as IPFIX"
        c = layers["cflow"]
        msg = {
            "version": int(c["cflow.version"]),
            "length": int(c["cflow.len"]),
            "seq": int(c["cflow.sequence"]),
            "export": int(c["cflow.timestamp_tree"]["cflow.exporttime"]),
            "domain": int(c["cflow.od_id"]),
            "templates": [],
            "data": [],
            "experts": [],
        }
        _collect_experts(c, msg["experts"])
        for key, s in c.items():
            if not (key.startswith("Set ") and isinstance(s, dict)):
                continue
            set_id = int(s["cflow.flowset_id"])
            if set_id == 2:
                msg["templates"] += [int(t["cflow.template_id"]) for k, t in s.items() if k.startswith("Template (")]
            else:
                assert "cflow.template_frame" in s, f"data set {set_id} decoded without a template ({key})"
                msg["data"] += [(set_id, rec) for k, rec in s.items() if k.startswith("Flow ")]
        messages.append(msg)
    return messages


def _collect_experts(node, out):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "_ws.expert" and isinstance(v, dict):
                out.append(v.get("_ws.expert.message", ""))
            else:
                _collect_experts(v, out)


# ---------------------------------------------------------------------------
# Running replay with the exporters
# ---------------------------------------------------------------------------

def logging_section(json_path, **keys):
    lines = ["[logging]", f"json = {json.dumps(str(json_path))}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def replay_file(natrix_bin, tmp_path, config, capture, quiet=True):
    cfg = tmp_path / "natrix.toml"
    cfg.write_text(config)
    args = [str(natrix_bin), "replay", "--config", str(cfg), "--in", str(capture), "--out", str(tmp_path / "out.pcapng")]
    if quiet:
        args.append("--quiet")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def export(natrix_bin, tmp_path, nat_config, capture, **logging):
    """Replays `capture` with the JSON log and an IPFIX collector; returns
    (JSON records, tshark-decoded messages)."""
    need_tshark()
    log = tmp_path / "events.jsonl"
    col = Collector()
    replay_file(natrix_bin, tmp_path, nat_config + logging_section(log, ipfix=f"127.0.0.1:{col.port}", **logging), capture)
    datagrams = col.finish()
    assert datagrams, "no IPFIX datagram reached the collector"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return records, tshark_decode(tmp_path, datagrams, col.port)


def check_stream(messages):
    """RFC 7011 framing as tshark sees it: version 10, size bound, templates
    before the data that uses them, sequence numbers counting data records."""
    seen_templates = set()
    records_before = 0
    for i, m in enumerate(messages):
        assert m["version"] == 10
        assert m["length"] <= MAX_MESSAGE, f"message {i} is {m['length']} bytes"
        assert m["seq"] == records_before, f"message {i}: sequence {m['seq']}, {records_before} data records sent before it"
        assert not m["experts"], f"tshark complains about message {i}: {m['experts']}"
        seen_templates.update(m["templates"])
        for set_id, _ in m["data"]:
            assert set_id in seen_templates, f"message {i}: data set {set_id} before its template"
        records_before += len(m["data"])
    assert messages[0]["templates"], "the first message carries the templates"
    assert set(messages[0]["templates"]) >= {256, 257, 258, 259}
    return [rec for m in messages for rec in m["data"]]


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

def test_example_capture_mappings_match_the_json_log(natrix_bin, tmp_path):
    nat = h.make_config(pool=(POOL,), nat={"max_ports_per_subscriber": 2000})
    records, messages = export(natrix_bin, tmp_path, nat, EXAMPLE)
    data = check_stream(messages)
    creates = [r for r in records if r["event"] == "mapping_create"]
    assert len(creates) > 1000, "the example capture creates thousands of mappings"
    assert sum(1 for _, d in data if int(d["cflow.nat_event"]) == BIB_CREATE) == len(creates)
    assert len(data) == len(records), "one IPFIX data record per JSON line"

    pool = ipaddress.ip_network(POOL)
    subscribers = ipaddress.ip_network(SUBSCRIBERS)
    first_ms = json_time_ms(records[0]["time"])
    for i, ((set_id, d), r) in enumerate(zip(data, records)):
        event = int(d["cflow.nat_event"])
        assert event == r["nat_event"], f"record {i}: {d} vs {r}"
        assert event in (BIB_CREATE, BIB_DELETE, QUOTA_EXCEEDED, PORTS_EXHAUSTED, ADDRESSES_EXHAUSTED)
        assert event not in (1, 2), "historic natEvent values are not used"
        assert ipaddress.ip_address(d["cflow.srcaddr"]) in subscribers
        assert d["cflow.srcaddr"] == r["subscriber"]
        assert int(d["cflow.protocol"]) == PROTO_NUMBER[r["proto"]]
        assert tshark_time_ms(d["cflow.observation_time_milliseconds"]) == json_time_ms(r["time"])
        if event in (BIB_CREATE, BIB_DELETE):
            assert set_id == 256
            assert ipaddress.ip_address(d["cflow.post_natsource_ipv4_address"]) in pool
            assert d["cflow.post_natsource_ipv4_address"] == r["external"]
            assert int(d["cflow.srcport"]) == r["subscriber_port"]
            assert int(d["cflow.post_naptsource_transport_port"]) == r["external_port"]
        else:
            assert set_id == 259
    # Capture time, not wall-clock time: a message is exported when the
    # capture's clock has passed its records, and never later than the next.
    stamped = [m for m in messages if m["data"]]
    for m, nxt in zip(stamped, stamped[1:] + [None]):
        times = [tshark_time_ms(d["cflow.observation_time_milliseconds"]) for _, d in m["data"]]
        assert m["export"] >= max(times) // 1000
        if nxt is not None:
            assert m["export"] <= min(tshark_time_ms(d["cflow.observation_time_milliseconds"]) for _, d in nxt["data"]) // 1000
        assert first_ms // 1000 <= m["export"] <= first_ms // 1000 + 3600


def udp_flows():
    return [(T0 + i, "inside", h.udp_out(sub, 40000 + i, SRV1, 53)) for i, sub in enumerate([SUB_A, SUB_A, SUB_B])]


def test_port_blocks_are_exported_with_their_range(natrix_bin, tmp_path):
    # The last frame comes after the UDP timeout: A's and B's blocks are released first.
    frames = udp_flows() + [(T0 + 1000, "inside", h.udp_out(SUB_C, 50000, SRV1, 53))]
    capture = tmp_path / "in.pcapng"
    h.write_pcapng(capture, frames)
    records, messages = export(natrix_bin, tmp_path, h.make_config(nat={"port_block_size": 64}), capture, unit="block")
    data = check_stream(messages)
    events = [int(d["cflow.nat_event"]) for _, d in data]
    assert events == [r["nat_event"] for r in records]
    assert events.count(BLOCK_ALLOC) == 3 and events.count(BLOCK_DEALLOC) == 2, events
    for (set_id, d), r in zip(data, records):
        assert set_id == 258
        assert d["cflow.srcaddr"] == r["subscriber"] and d["cflow.post_natsource_ipv4_address"] == r["external"]
        start, end = int(d["cflow.port_range_start"]), int(d["cflow.port_range_end"])
        assert (start, end) == (r["external_port"], r["port_range_end"])
        assert end - start == 63
        assert int(d["cflow.protocol"]) == 17


def test_sessions_carry_the_destination(natrix_bin, tmp_path):
    capture = tmp_path / "in.pcapng"
    h.write_pcapng(capture, udp_flows())
    records, messages = export(natrix_bin, tmp_path, h.make_config(), capture, unit="session")
    data = check_stream(messages)
    sessions = [(d, r) for (s, d), r in zip(data, records) if s == 257]
    assert len(sessions) == 3
    for d, r in sessions:
        assert int(d["cflow.nat_event"]) == SESSION_CREATE == r["nat_event"]
        assert d["cflow.dstaddr"] == SRV1 == d["cflow.post_natdestination_ipv4_address"]
        assert int(d["cflow.dstport"]) == 53 == int(d["cflow.post_naptdestination_transport_port"])
        assert int(d["cflow.post_naptsource_transport_port"]) == r["external_port"]


def test_an_absent_collector_is_counted_not_silent(natrix_bin, tmp_path):
    # A port nobody listens on: the kernel refuses, natrix counts the records as lost.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = tmp_path / "events.jsonl"
    nat = h.make_config(pool=(POOL,), nat={"max_ports_per_subscriber": 2000})
    proc = replay_file(natrix_bin, tmp_path, nat + logging_section(log, ipfix=f"127.0.0.1:{port}"), EXAMPLE, quiet=False)
    m = re.search(r"ipfix: (\d+) records in \d+ messages, \d+ bytes, (\d+) lost", proc.stdout)
    assert m, proc.stdout
    sent, lost = int(m.group(1)), int(m.group(2))
    assert lost > 0
    assert sent + lost == len(log.read_text().splitlines())
    assert "WARNING" in proc.stdout and "lost" in proc.stdout


SYSLOG = re.compile(r"^<(\d{1,3})>1 (\S+) (\S+) (\S+) (\S+) (\S+) (-|\[(\S+)((?: [^ =\]]+=\"(?:[^\"\\\]]|\\.)*\")*)\])(?: (.*))?$", re.S)


def test_syslog_over_udp_follows_rfc5424(natrix_bin, tmp_path):
    frames = udp_flows() + [(T0 + 1000, "inside", h.udp_out(SUB_C, 50000, SRV1, 53))]
    capture = tmp_path / "in.pcapng"
    h.write_pcapng(capture, frames)
    log = tmp_path / "events.jsonl"
    col = Collector()
    replay_file(natrix_bin, tmp_path, h.make_config() + logging_section(log, syslog=f"udp:127.0.0.1:{col.port}"), capture)
    datagrams = col.finish()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(datagrams) == len(records) == 7  # 4 creates, 3 deletes
    for raw, r in zip(datagrams, records):
        text = raw.decode("utf-8")
        m = SYSLOG.match(text)
        assert m, text
        pri, ts, host, app, procid, msgid = m.group(1, 2, 3, 4, 5, 6)
        assert int(pri) == 16 * 8 + 6, "local0.info"
        assert json_time_ms(ts) == json_time_ms(r["time"])
        assert app == "natrix" and procid.isdigit() and host
        assert msgid == r["event"]
        assert m.group(8) == "natrix@32473"
        params = dict(re.findall(r' ([^ =]+)="((?:[^"\\\]]|\\.)*)"', m.group(9)))
        expected = {k: str(v) for k, v in r.items() if k not in ("time", "event")}
        assert params == expected, text
        kv = dict(p.split("=", 1) for p in m.group(10).split())
        assert kv == {k: str(v) for k, v in r.items() if k != "time"}, text


def test_check_config_names_the_exporter_keys(natrix):
    import tempfile
    for key, value in [("ipfix", "192.0.2.10"), ("ipfix", "collector.example:4739"), ("syslog", "192.0.2.10:514"),
                       ("syslog", "tcp:192.0.2.10:514")]:
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(h.make_config() + f"[logging]\n{key} = {json.dumps(value)}\n")
        proc = natrix("check-config", f.name)
        assert proc.returncode != 0, value
        assert f"logging.{key}" in h.proc_text(proc), h.proc_text(proc)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(h.make_config() + "[logging]\nipfix = \"192.0.2.10:4739\"\nsyslog = \"udp:192.0.2.10:514\"\n")
    proc = natrix("check-config", f.name)
    assert proc.returncode == 0, h.proc_text(proc)
    assert "not implemented" not in h.proc_text(proc)
