"""The management port under abuse (issue 16, "Operator-grade natrix"):
1,000 idle TCP connections (and slow clients that send half a request) do
not stop `natrix show stats` from answering within a second; an oversize
request is refused (431/413 or the connection closed) and the server stays
up; /metrics is valid Prometheus text (0.0.4) by default and valid
OpenMetrics when asked for, with every family README documents.

Every client here runs inside nx-nat, where natrix's API listens on
127.0.0.1 (the lab config's `[management] listen`).
"""

import json
import re

import pytest

import e2e_harness as h
from e2e_harness import NS_NAT

h.skip_module_if_unavailable()

# Opens COUNT connections to HOST:PORT and keeps them open (sending nothing,
# or with PARTIAL a request line and one header without the blank line that
# ends the head), then times `natrix show stats --json` and a second one,
# then reports how many of its connections natrix has closed meanwhile.
IDLE_CLIENTS = r"""
import json, resource, select, socket, subprocess, sys, time
host, port, count, partial, natrix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = count + 256
if soft != resource.RLIM_INFINITY and soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard if hard == resource.RLIM_INFINITY else max(hard, want)))
socks, failed = [], []
for i in range(count):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
        if partial:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    except OSError as e:
        failed.append(str(e))
        s.close()
        continue
    socks.append(s)
time.sleep(0.5)
timings = []
answers = []
for _ in range(2):
    t0 = time.monotonic()
    r = subprocess.run([natrix, "show", "stats", "--json", "--api", f"{host}:{port}"],
                       capture_output=True, text=True, timeout=30)
    timings.append(time.monotonic() - t0)
    answers.append({"rc": r.returncode, "stdout": r.stdout[-3000:], "stderr": r.stderr[-3000:]})
readable, _, _ = select.select(socks, [], [], 0)
closed = 0
for s in readable:
    try:
        closed += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except OSError:
        closed += 1
print(json.dumps({"opened": len(socks), "failed": failed[:5], "failed_count": len(failed),
                  "timings": timings, "answers": answers, "closed_by_natrix": closed}))
"""

# Sends one raw request (argv: host, port, size of the oversize part, where
# it goes: "header" or "target") and reports what came back.
OVERSIZE = r"""
import json, socket, sys
host, port, size, where = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
big = b"a" * size
if where == "header":
    req = b"GET /api/stats HTTP/1.1\r\nHost: x\r\nX-Big: " + big + b"\r\n\r\n"
else:
    req = b"GET /api/stats?" + big + b" HTTP/1.1\r\nHost: x\r\n\r\n"
s = socket.create_connection((host, port), timeout=10)
sent_error = None
try:
    s.sendall(req)
except OSError as e:
    sent_error = str(e)
data = b""
recv_error = None
try:
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
except OSError as e:
    recv_error = str(e)
print(json.dumps({"sent_error": sent_error, "recv_error": recv_error,
                  "head": data[:200].decode("latin-1")}))
"""

# GET PATH with an optional Accept header; prints status, content type, body.
FETCH = r"""
import json, sys, urllib.request
url, accept = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
with urllib.request.urlopen(req, timeout=10) as r:
    print(json.dumps({"status": r.status, "content_type": r.headers.get("Content-Type"),
                      "body": r.read().decode()}))
"""


def _py(script, *args, timeout=120):
    r = h.run_in(NS_NAT, "python3", "-c", script, *args, timeout=timeout)
    assert r.returncode == 0, f"helper in {NS_NAT} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _api(n):
    host, port = (n.api or h.DEFAULT_API).rsplit(":", 1)
    return host, port


def _stats_ok(n, within=None):
    r = n.cli("show", "stats", "--json")
    assert r.returncode == 0, f"`natrix show stats --json` failed:\n{r.stdout}\n{r.stderr}\n{n.output()}"
    doc = json.loads(r.stdout)
    assert isinstance(doc, dict) and "interfaces" in doc, doc
    return doc


@pytest.mark.parametrize("partial", [False, True], ids=["idle", "half-request"])
def test_thousand_idle_connections_do_not_stop_show_stats(natrix, partial):
    """1,000 connections to the management port that send nothing (or half
    a request head and then nothing) are held open while `natrix show stats`
    runs: it answers, twice, each within a second."""
    n = natrix()
    host, port = _api(n)
    res = _py(IDLE_CLIENTS, host, port, 1000, "1" if partial else "0", h.natrix_bin(), timeout=180)
    assert res["opened"] >= 990, f"could not open the idle connections: {res}"
    for t, a in zip(res["timings"], res["answers"]):
        assert a["rc"] == 0, f"`natrix show stats` failed beside 1,000 idle connections: {a}\n{n.output()}"
        doc = json.loads(a["stdout"])
        assert "interfaces" in doc, doc
        assert t < 1.0, (f"`natrix show stats` took {t:.2f} s beside 1,000 idle connections "
                         f"(timings {res['timings']})")
    assert n.alive(), n.output()
    _stats_ok(n)


@pytest.mark.parametrize("where", ["header", "target"])
def test_oversize_request_is_refused_and_server_stays_up(natrix, where):
    """A request head of over 1 MiB (one huge header, or a huge request
    target) gets 431 or 413, or the connection is closed; natrix keeps
    answering."""
    n = natrix()
    host, port = _api(n)
    res = _py(OVERSIZE, host, port, 1 << 20, where)
    head = res["head"]
    if head:
        status = head.split(" ", 2)[1] if head.startswith("HTTP/1.") else None
        assert status in ("431", "413", "414"), f"oversize request answered: {head!r}"
        assert not head.startswith("HTTP/1.1 200"), head
    # else: closed (EOF or reset) without an answer, which is a refusal too.
    assert n.alive(), n.output()
    _stats_ok(n)


# Every family README lists ("Metrics"), with its labels.
DOCUMENTED = {
    "natrix_rx_packets_total": {"interface"}, "natrix_rx_bytes_total": {"interface"},
    "natrix_tx_packets_total": {"interface"}, "natrix_tx_bytes_total": {"interface"},
    "natrix_tx_dropped_total": {"interface"}, "natrix_rx_refused_total": {"interface"},
    "natrix_rx_kernel_dropped_total": {"interface"}, "natrix_rx_checksums_completed_total": {"interface"},
    "natrix_translated_packets_total": {"interface"}, "natrix_generated_packets_total": {"interface"},
    "natrix_offloaded_packets_total": {"interface"}, "natrix_offloaded_bytes_total": {"interface"},
    "natrix_offload_flows": set(), "natrix_offload_table_full_total": set(), "natrix_offload_egress": {"interface"},
    "natrix_offload_returned_total": {"reason"},
    "natrix_drops_total": {"reason"}, "natrix_sessions": {"protocol"}, "natrix_mappings": {"protocol"},
    "natrix_sessions_created_total": set(), "natrix_mappings_created_total": set(),
    "natrix_subscribers": set(), "natrix_pool_ports_in_use": set(), "natrix_pool_ports_total": set(),
    "natrix_subscribers_port_use": {"at_least"}, "natrix_worker_packets_total": {"worker"},
    "natrix_worker_busy_seconds_total": {"worker"}, "natrix_pcp_requests_total": {"result"},
    "natrix_pcp_requests_ignored_total": set(), "natrix_log_records_total": set(),
    "natrix_log_records_lost_total": set(), "natrix_handoff_dropped_total": set(),
    "natrix_arp_replies_sent_total": set(), "natrix_arp_requests_sent_total": set(),
    "natrix_next_hop_unresolved_total": set(), "natrix_no_route_total": set(),
    "natrix_not_for_us_total": set(), "natrix_not_ipv4_total": set(), "natrix_memory_bytes": set(),
}

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def _parse(text, openmetrics):
    """A strict reading of the exposition text: comments are HELP, TYPE
    (and UNIT in OpenMetrics) of the family whose samples follow; sample
    lines are NAME{LABELS} VALUE. Returns {sample name: [label dicts]}."""
    lines = text.split("\n")
    assert lines[-1] == "", "exposition must end with a newline"
    lines = lines[:-1]
    if openmetrics:
        assert lines[-1] == "# EOF", "OpenMetrics text must end with # EOF"
        lines = lines[:-1]
    else:
        assert "# EOF" not in lines
    samples, family, kind, seen = {}, None, None, set()
    for line in lines:
        if line.startswith("#"):
            parts = line.split(" ", 3)
            assert parts[1] in (("HELP", "TYPE", "UNIT") if openmetrics else ("HELP", "TYPE")), line
            if parts[1] == "TYPE":
                family, kind = parts[2], parts[3]
                assert kind in ("counter", "gauge"), line
                assert family not in seen, f"family declared twice: {line}"
                seen.add(family)
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.group(1), m.group(3) or "", m.group(4)
        float(value)
        expect = family + "_total" if openmetrics and kind == "counter" else family
        assert name == expect, f"sample {name} outside its family {family}: {line}"
        d = {}
        rest = labels
        while rest:
            lm = _LABEL.match(rest)
            assert lm, f"bad labels in {line!r}"
            d[lm.group(1)] = lm.group(2)
            rest = rest[lm.end():]
        samples.setdefault(name, []).append(d)
    return samples


def _check_documented(samples):
    for name, labels in DOCUMENTED.items():
        assert name in samples, f"{name} (documented in README) is missing from /metrics"
        got = set().union(*[set(d) for d in samples[name]])
        assert got == labels, f"{name}: labels {got}, README documents {labels}"


def test_metrics_parse_in_both_formats(natrix):
    """GET /metrics: Prometheus text 0.0.4 for a plain client, OpenMetrics
    for one that asks (as Prometheus does), both well formed and with every
    documented family; checked with the prometheus_client parsers too when
    that package is installed."""
    n = natrix()
    host, port = _api(n)
    url = f"http://{host}:{port}/metrics"
    plain = _py(FETCH, url, "")
    assert plain["status"] == 200
    assert plain["content_type"].startswith("text/plain; version=0.0.4"), plain["content_type"]
    om = _py(FETCH, url, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
    assert om["status"] == 200
    assert om["content_type"].startswith("application/openmetrics-text; version=1.0.0"), om["content_type"]
    a, b = _parse(plain["body"], False), _parse(om["body"], True)
    assert a.keys() == b.keys()
    _check_documented(a)
    _check_documented(b)
    try:
        from prometheus_client.parser import text_string_to_metric_families as parse_text
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
    except ImportError:
        return
    assert list(parse_text(plain["body"]))
    assert list(parse_om(om["body"]))


def test_api_errors_keep_their_shape(natrix):
    """Unknown endpoint 404, wrong method 405, bad parameter 400, each with a
    JSON {"error": ...} body, as `natrix show`/`clear` expect."""
    n = natrix()
    host, port = _api(n)
    script = r"""
import json, sys, urllib.request, urllib.error
base = sys.argv[1]
out = []
for method, path in (("GET", "/nope"), ("POST", "/api/stats"), ("GET", "/api/sessions?subscriber=banana"),
                     ("POST", "/api/clear")):
    req = urllib.request.Request(base + path, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            out.append([r.status, r.headers.get("Content-Type"), r.read().decode()])
    except urllib.error.HTTPError as e:
        out.append([e.code, e.headers.get("Content-Type"), e.read().decode()])
print(json.dumps(out))
"""
    r = h.run_in(NS_NAT, "python3", "-c", script, f"http://{host}:{port}", timeout=30)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert [g[0] for g in got] == [404, 405, 400, 400], got
    for status, ctype, body in got:
        assert ctype.startswith("application/json"), got
        assert "error" in json.loads(body), got
