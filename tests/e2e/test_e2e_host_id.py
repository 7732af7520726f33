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
  server's kernel; plain kernel clients still connect;
- ACK mode (seed 000 section 3.2.2, figure 6): a kernel client's SYN
  reaches a server that supports HOST_ID_ENABLED (scapy on a raw socket in
  nx-srv1, the kernel's RSTs dropped by nftables) with ENABLED; the
  server's echo is gone from the SYN-ACK the client gets; the client's
  first ACK reaches the server with HOST_ID_BOUCADAIR, later segments do
  not; without the echo no ACK gets BOUCADAIR. tshark on both links judges.

Those SYNs carry HOST_ID from the client itself (scapy in nx-sub1): no
kernel writes the draft's options.
"""

import shutil
import subprocess

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
        self.tshark = h.Tshark(NS_SRV1, "eth0", f"tcp dst port {port} and tcp[tcpflags] & tcp-syn != 0", self.path)

    def syns(self):
        """[(src, sport, option kinds, options hex)] of the SYNs (not SYN-ACKs) captured, decoded by tshark."""
        self.tshark.stop()
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


# --- ACK mode (seed 000 section 3.2.2, figure 6) ---------------------------------

ENABLED = 202
ACK_MODE_PORT = 7301
ACK_MODE_TABLE = "host_id_ack_test"
TCP_SYN, TCP_RST, TCP_ACK = 0x02, 0x04, 0x10

# A TCP server for nx-srv1 that supports HOST_ID_ENABLED, which no kernel
# does: scapy answers a SYN to PORT with a SYN-ACK echoing ENABLED when the
# SYN carried it (seed 000 section 3.2.2; with "silent" it never echoes, as
# a server without HOST_ID support), answers the client's data with
# "hi\n" and its FIN with a FIN. Segments arrive on a raw TCP socket; the
# kernel's own RSTs for the port without a listener are dropped by nftables.
ACK_MODE_SERVER = r"""
import socket, sys
from scapy.all import IP, TCP, Raw, conf, send
conf.verb = 0
addr, port, enabled, echoes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "echo"
ISN = 70000
next_seq = {}
rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
print("ready", flush=True)
while True:
    p = IP(rx.recv(65535))
    if p.dst != addr or TCP not in p or p[TCP].dport != port:
        continue
    t, data = p[TCP], bytes(p[TCP].payload)
    reply = IP(src=addr, dst=p.src) / TCP(sport=port, dport=t.sport, window=65535)
    if t.flags == "S":
        echo = [(enabled, b"")] if echoes and any(o[0] == enabled for o in t.options) else []
        reply[TCP].flags, reply[TCP].seq, reply[TCP].ack = "SA", ISN, t.seq + 1
        reply[TCP].options = [("MSS", 1460)] + echo
        next_seq[t.sport] = ISN + 1
    elif data:
        reply[TCP].flags, reply[TCP].seq, reply[TCP].ack = "PA", next_seq[t.sport], t.seq + len(data) + (1 if t.flags.F else 0)
        reply = reply / Raw(b"hi\n")
        next_seq[t.sport] += 3
    elif t.flags.F:
        reply[TCP].flags, reply[TCP].seq, reply[TCP].ack = "FA", next_seq[t.sport], t.seq + 1
    else:
        continue
    send(reply)
"""

ACK_MODE_CLIENT = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print(s.getsockname()[1], flush=True)
s.sendall(b"hello\n")
print(s.recv(100).decode().strip(), flush=True)
time.sleep(0.3)
s.close()
time.sleep(0.3)
"""

SEGMENT_FIELDS = ("ip.src", "tcp.srcport", "tcp.flags", "tcp.seq_raw", "tcp.ack_raw", "tcp.hdr_len", "tcp.option_kind", "tcp.options")


def tcp_options(raw):
    """{kind: the option's bytes} from a TCP header's options (RFC 9293
    section 3.1: EOL ends the list, NOP is one byte, the rest carry a length)."""
    found, i = {}, 0
    while i < len(raw) and raw[i] != 0:
        if raw[i] == 1:
            i += 1
            continue
        length = raw[i + 1] if i + 1 < len(raw) else 0
        assert length >= 2, f"malformed option list {raw.hex()}"
        found[raw[i]] = raw[i:i + length]
        i += length
    return found


def segments(cap):
    """The capture's TCP segments decoded by tshark, in order, as dicts."""
    out = []
    for src, sport, flags, seq, ack, hdr_len, kinds, options in cap.fields("tcp", *SEGMENT_FIELDS):
        out.append({"src": src, "sport": int(sport), "flags": int(flags, 16), "seq": int(seq), "ack": int(ack),
                    "hdr_len": int(hdr_len), "kinds": [int(k) for k in kinds.split(",") if k],
                    "options": tcp_options(bytes.fromhex(options.replace(":", "")))})
    return out


@pytest.fixture
def ack_mode_server():
    """Starts ACK_MODE_SERVER in nx-srv1 (`start(echo)`), its kernel's RSTs
    from the port dropped for the test's length."""
    if shutil.which("nft") is None:
        pytest.skip("nft not installed here (apt-get install -y nftables)")
    servers = []

    def start(echo):
        server = subprocess.Popen(h.netns_cmd(NS_SRV1, "python3", "-c", ACK_MODE_SERVER, SRV1, str(ACK_MODE_PORT), str(ENABLED),
                                              "echo" if echo else "silent"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=h.clean_env())
        servers.append(server)
        line = server.stdout.readline()
        assert line.strip() == "ready", f"the ACK-mode server did not start: {line!r} {server.stderr.read() if server.poll() is not None else ''}"

    try:
        for command in (f"add table inet {ACK_MODE_TABLE}",
                        f"add chain inet {ACK_MODE_TABLE} output {{ type filter hook output priority 0 ; }}",
                        f"add rule inet {ACK_MODE_TABLE} output tcp sport {ACK_MODE_PORT} tcp flags & rst == rst drop"):
            h.run_in(NS_SRV1, "nft", command, check=True)
        yield start
    finally:
        for server in servers:
            server.kill()
            server.wait(timeout=5)
        h.run_in(NS_SRV1, "nft", f"delete table inet {ACK_MODE_TABLE}")


def is_syn(s):
    return s["flags"] & (TCP_SYN | TCP_ACK) == TCP_SYN


def is_syn_ack(s):
    return s["flags"] & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK


def ack_mode_connection(natrix, ack_mode_server, tmp_path, echo):
    """natrix in ACK mode (BOUCADAIR port-ipv4), the server echoing or not,
    one kernel connection from nx-sub1 with tshark on both links. Returns
    the client's internal port, the segments the client saw, those the
    server saw from itself, and the ACKs (not SYN, not RST) it saw from the
    client (the pool), in order."""
    need_tshark()
    n = natrix({"host_id": {"mode": "ack", "boucadair": "port-ipv4"}})
    ack_mode_server(echo)
    bpf = f"tcp port {ACK_MODE_PORT}"
    at_client = h.Tshark(NS_SUB1, "eth0", bpf, tmp_path / "client.pcapng")
    at_server = h.Tshark(NS_SRV1, "eth0", bpf, tmp_path / "server.pcapng")
    r = h.run_in(NS_SUB1, "python3", "-c", ACK_MODE_CLIENT, SRV1, str(ACK_MODE_PORT), timeout=20)
    assert r.returncode == 0, f"the kernel client's connection failed: {r.stderr}"
    port, answer = r.stdout.split()
    assert answer == "hi", "the connection works end to end"
    client_side, server_side = segments(at_client), segments(at_server)
    from_client = [s for s in server_side if h.in_pool(s["src"], n.pool)]
    from_server = [s for s in server_side if s["src"] == SRV1]
    syns = [s for s in from_client if is_syn(s)]
    assert syns, f"no SYN from the pool reached the server: {server_side}"
    assert ENABLED in syns[0]["kinds"] and syns[0]["options"].get(ENABLED) == bytes([ENABLED, 2]), f"SYN at the server: {syns[0]}"
    acks = [s for s in from_client if s["flags"] & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_ACK]
    assert len(acks) >= 3, f"the handshake's ACK, the data and the client's ACK of the answer: {acks}"
    return int(port), client_side, from_server, acks


def test_ack_mode_enabled_in_the_syn_echo_removed_boucadair_in_the_first_ack_only(natrix, ack_mode_server, tmp_path):
    """Seed 000 section 3.2.2, figure 6, with CONTRACTS' layout: natrix puts
    HOST_ID_ENABLED in the kernel client's SYN; the server (scapy) echoes it
    in its SYN-ACK; the client gets that SYN-ACK without the echo (its bytes
    NOPs, the header as long); the client's first ACK reaches the server with
    HOST_ID_BOUCADAIR (lifetime 0, origin 2: the internal port then the
    internal IPv4 address, zero-padded to 7 bytes); later segments do not
    carry it. tshark on both links judges."""
    port, client_side, from_server, acks = ack_mode_connection(natrix, ack_mode_server, tmp_path, echo=True)
    echoed = [s for s in from_server if is_syn_ack(s)]
    assert echoed and ENABLED in echoed[0]["kinds"], f"the server's SYN-ACK should echo ENABLED: {echoed}"
    received = [s for s in client_side if s["src"] == SRV1 and is_syn_ack(s)]
    assert received, f"no SYN-ACK reached the client: {client_side}"
    assert ENABLED not in received[0]["kinds"], f"the echo must not reach the client: tshark's kinds {received[0]['kinds']}"
    assert received[0]["hdr_len"] == echoed[0]["hdr_len"], "removed options become NOPs: the header keeps its length"

    first = acks[0]
    assert first["ack"] == echoed[0]["seq"] + 1, f"the first ACK acknowledges the SYN-ACK: {first}"
    internal = port.to_bytes(2, "big") + bytes(int(x) for x in SUB1.split("."))
    want = bytes([BOUCADAIR, 10, 0x02]) + internal + b"\x00"
    assert BOUCADAIR in first["kinds"], f"the first ACK at the server: tshark's kinds {first['kinds']}"
    assert first["options"].get(BOUCADAIR) == want, f"BOUCADAIR {first['options'].get(BOUCADAIR, b'').hex()}, want {want.hex()}"
    later = [s for s in acks[1:] if BOUCADAIR in s["kinds"]]
    assert not later, f"only the first ACK carries BOUCADAIR: {later}"


def test_ack_mode_without_the_servers_echo_adds_nothing_to_the_ack(natrix, ack_mode_server, tmp_path):
    """A server that does not support HOST_ID_ENABLED does not echo it
    (seed 000 section 3.2.2: only "if the remote TCP server supports that
    option"): no ACK of the connection gets HOST_ID_BOUCADAIR."""
    _, _, from_server, acks = ack_mode_connection(natrix, ack_mode_server, tmp_path, echo=False)
    synack = [s for s in from_server if is_syn_ack(s)]
    assert synack and ENABLED not in synack[0]["kinds"], f"the server's SYN-ACK carries no echo: {synack}"
    carrying = [s for s in acks if BOUCADAIR in s["kinds"]]
    assert not carrying, f"BOUCADAIR without the echo: {carrying}"
