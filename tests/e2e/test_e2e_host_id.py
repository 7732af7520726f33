"""HOST_ID TCP options (seed 000, CONTRACTS.md "HOST_ID TCP options") through
`natrix run`, judged by real stacks and an independent decoder:

- a kernel TCP client in nx-sub1 connects through natrix (NAPT44, SYN mode)
  to the kernel server in nx-srv1; tshark in nx-srv1 decodes the SYN that
  arrived: its options are Linux's own, then HOST_ID_WING (kind 200, the
  last 16 bits of the client's private address) and HOST_ID_BOUCADAIR (kind
  201, origin 2: the client's port then its address), and the connection works;
- natrix in router mode (`[nat] mode = "off"`) in front of the kernel server
  with seed 000 section 8's policy: a SYN whose WING value is in the dropped
  range never reaches the server; one outside the range reaches it with its
  HOST_ID overwritten by NOPs (strip) and is answered with a SYN-ACK by the
  server's kernel; plain kernel clients still connect.

Those SYNs carry HOST_ID from the client itself (scapy in nx-sub1): no
kernel writes the draft's options.
"""

import shutil
import signal
import subprocess
import time

import pytest

import e2e_harness as h
from e2e_harness import NS_SRV1, NS_SRV2, NS_SRV3, NS_SUB1, SRV1, SUB1

h.skip_module_if_unavailable()

WING, BOUCADAIR = 200, 201
NAT_OUTSIDE = "198.51.100.1"
SUBSCRIBERS = "100.64.0.0/10"


def need_tshark():
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed here (apt-get install -y tshark)")


class Capture:
    """tshark capturing TCP SYNs to `port` on nx-srv1's eth0, into a file."""

    def __init__(self, tmp_path, port):
        self.path = tmp_path / "srv1.pcapng"
        # The capture file must be writable by tshark's dumpcap whoever runs it.
        self.proc = subprocess.Popen(
            h.netns_cmd(NS_SRV1, "tshark", "-i", "eth0", "-w", str(self.path), "-f", f"tcp dst port {port} and tcp[tcpflags] & tcp-syn != 0"),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=h.clean_env())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if "Capturing on" in line or not line:
                break
        time.sleep(0.3)

    def syns(self):
        """[(src, sport, option kinds, options hex)] of the SYNs (not SYN-ACKs) captured, decoded by tshark."""
        time.sleep(0.5)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        out = subprocess.run(["tshark", "-r", str(self.path), "-Y", "tcp.flags.syn == 1 && tcp.flags.ack == 0", "-T", "fields",
                              "-e", "ip.src", "-e", "tcp.srcport", "-e", "tcp.option_kind", "-e", "tcp.options"],
                             capture_output=True, text=True, timeout=30, env=h.clean_env())
        assert out.returncode == 0, out.stderr
        rows = []
        for line in out.stdout.splitlines():
            src, sport, kinds, options = (line.split("\t") + ["", "", "", ""])[:4]
            rows.append((src, int(sport), [int(k) for k in kinds.split(",") if k], bytes.fromhex(options.replace(":", ""))))
        return rows


def test_a_kernel_clients_syn_arrives_with_wing_and_boucadair(natrix, agent, servers, tmp_path):
    need_tshark()
    n = natrix({"host_id": {"mode": "syn", "wing": True, "boucadair": "port-ipv4"}})
    cap = Capture(tmp_path, h.TCP_REPORT)
    client = agent(NS_SUB1)
    sid, peer = client.tcp_report((SRV1, h.TCP_REPORT), timeout=5.0)
    assert h.in_pool(peer[0], n.pool), f"translated as ever: the server saw {peer}"
    client.call("tcp_send", sid=sid, data="still here\n")
    rows = [r for r in cap.syns() if h.in_pool(r[0], n.pool)]
    assert rows, "tshark saw no SYN from the pool"
    _, _, kinds, options = rows[0]
    assert WING in kinds and BOUCADAIR in kinds, f"tshark's option kinds: {kinds}"
    low16 = bytes(int(x) for x in SUB1.split("."))[2:]
    assert bytes([WING, 4]) + low16 in options, options.hex()
    at = options.index(bytes([BOUCADAIR, 10]))
    boucadair = options[at:at + 10]
    assert boucadair[2] == 0x02, "lifetime 0, origin 2 (port then IPv4)"
    sub_addr = bytes(int(x) for x in SUB1.split("."))
    assert boucadair[5:9] == sub_addr and boucadair[9] == 0, boucadair.hex()
    assert options[:2] == bytes([2, 4]), "Linux's own options come first (MSS)"


SCAPY_SYN = r"""
import sys
from scapy.all import IP, TCP, conf, sr1
conf.verb = 0
dst, dport, sport, value = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
syn = IP(dst=dst) / TCP(sport=sport, dport=dport, flags="S", seq=1000, options=[("MSS", 1460), (200, value.to_bytes(2, "big")), ("NOP", None), ("NOP", None)])
answer = sr1(syn, timeout=3)
print("synack" if answer is not None and answer.haslayer(TCP) and answer[TCP].flags == "SA" else "none")
"""


def scapy_syn(sport, value):
    r = h.run_in(NS_SUB1, "python3", "-c", SCAPY_SYN, SRV1, str(h.TCP_REPORT), str(sport), str(value), timeout=20)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def router(natrix, tmp_path):
    """natrix in router mode with seed 000 section 8's policy (its JSON log
    in tmp_path/events.jsonl), and the servers' route back to the
    subscribers for the test's length."""
    routed = []
    try:
        for ns in (NS_SRV1, NS_SRV2, NS_SRV3):
            r = h.run_in(ns, "ip", "route", "replace", SUBSCRIBERS, "via", NAT_OUTSIDE)
            assert r.returncode == 0, r.stderr
            routed.append(ns)
        rules = [h.Inline(option="wing", value="1000-2000", action="drop"), h.Inline(option="wing", value="0x0fa0", action="log"),
                 h.Inline(option="any", action="strip")]
        log = tmp_path / "events.jsonl"
        yield natrix({"nat": h.Inline(mode="off"), "host_id": {"rule": rules}, "logging": {"json": str(log)}})
    finally:
        for ns in routed:
            h.run_in(ns, "ip", "route", "del", SUBSCRIBERS, "via", NAT_OUTSIDE)


def test_policy_in_front_of_a_kernel_server_drops_a_range_and_strips_the_rest(router, agent, servers, tmp_path):
    need_tshark()
    cap = Capture(tmp_path, h.TCP_REPORT)
    assert scapy_syn(41000, 1500) == "none", "a WING value in 1000-2000 is dropped before the server"
    assert scapy_syn(41001, 3000) == "synack", "the server's kernel answers a SYN outside the range"
    sid, peer = agent(NS_SUB1).tcp_report((SRV1, h.TCP_REPORT), timeout=5.0)
    assert peer[0] == SUB1, "router mode: the server sees the subscriber's own address"
    rows = {sport: (kinds, options) for src, sport, kinds, options in cap.syns() if src == SUB1}
    assert 41000 not in rows, "the dropped SYN never reached the server"
    kinds, options = rows[41001]
    assert WING not in kinds, f"stripped: tshark's option kinds {kinds}"
    # WING's 4 bytes are NOPs, after them the client's own 2 NOPs and scapy's zero padding.
    assert options == bytes([2, 4, 5, 180]) + b"\x01" * 6 + b"\x00\x00", options.hex()


def test_a_log_rule_writes_the_event_log_under_natrix_run(router, servers, tmp_path):
    """`action = "log"` (seed 000 section 8.4): the SYN passes with its WING,
    and natrix run's JSON event log gets {"event": "host_id", ...}."""
    import json

    assert scapy_syn(41002, 4000) == "synack"
    assert router.stop() == 0, router.output()
    router.reported = True
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    logged = [e for e in events if e.get("event") == "host_id"]
    assert len(logged) == 1, events
    e = logged[0]
    assert (e["rule"], e["option"], e["value"], e["src"], e["src_port"], e["dst"], e["dst_port"]) == (1, "wing", 4000, SUB1, 41002, SRV1, h.TCP_REPORT)


# Seed 000 section 6: connection success and setup delay with and without
# each option. K connections per configuration, one after another, from the
# kernel in nx-sub1; each connect()'s duration is the handshake's.
CONNECT_TIMES = r"""
import json, socket, sys, time
dst, port, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times, failed = [], 0
for _ in range(k):
    s = socket.socket()
    s.settimeout(3)
    t = time.perf_counter()
    try:
        s.connect((dst, port))
        times.append((time.perf_counter() - t) * 1e6)
    except OSError:
        failed += 1
    s.close()
print(json.dumps({"us": times, "failed": failed}))
"""

DELAY_CONFIGS = {
    "no option": {},
    "HOST_ID_WING": {"host_id": {"mode": "syn", "wing": True}},
    "HOST_ID_BOUCADAIR (port-ipv4)": {"host_id": {"mode": "syn", "boucadair": "port-ipv4"}},
    "HOST_ID_ENABLED": {"host_id": {"mode": "syn", "enabled": True}},
}
CONNECTIONS = 100
ROUNDS = 3


def test_every_connection_succeeds_with_each_option_and_the_setup_delay_is_recorded(natrix, servers, tmp_path):
    """Seed 000's success ratio (figures 10-12: no server in the lab rejects
    the options) as an assertion, and its delay comparison (section 6.1.1.2)
    as a record: median and 90th percentile connect() time per option, the
    share of connections faster than the median without options. Written to
    $HOST_ID_DELAY_OUT (JSON) when set, for docs/BENCHMARKS.md."""
    import json
    import os
    import statistics

    samples = {name: [] for name in DELAY_CONFIGS}
    # The configurations in turn, ROUNDS times, so a busy moment of the host hits all alike.
    for _ in range(ROUNDS):
        for name, overrides in DELAY_CONFIGS.items():
            n = natrix(overrides)
            r = h.run_in(NS_SUB1, "python3", "-c", CONNECT_TIMES, SRV1, str(h.TCP_REPORT), str(CONNECTIONS), timeout=120)
            assert r.returncode == 0, r.stderr
            got = json.loads(r.stdout)
            assert got["failed"] == 0, f"{name}: {got['failed']} of {CONNECTIONS} connections failed"
            samples[name] += got["us"]
            # One natrix at a time on the lab's interfaces: this one ends here, cleanly.
            assert n.stop() == 0, n.output()
            n.reported = True
    results = {}
    for name, us in samples.items():
        us = sorted(us)
        results[name] = {"median_us": statistics.median(us), "p90_us": us[int(0.9 * len(us)) - 1], "us": us}
    base = results["no option"]["median_us"]
    table = {name: {"median_us": round(v["median_us"], 1), "p90_us": round(v["p90_us"], 1),
                    "faster_than_no_option_median": round(sum(t < base for t in v["us"]) / len(v["us"]), 3)}
             for name, v in results.items()}
    print(json.dumps(table, indent=1))
    if os.environ.get("HOST_ID_DELAY_OUT"):
        with open(os.environ["HOST_ID_DELAY_OUT"], "w") as f:
            json.dump({"connections": CONNECTIONS * ROUNDS, "results": table}, f, indent=1)
