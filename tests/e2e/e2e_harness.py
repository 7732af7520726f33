"""Helpers for the natrix end-to-end tests: the lab's address plan, a TOML
writer for test configs, the natrix process wrapper, and the client for
e2e_agent.py running inside each namespace.

Written from the RFCs, the repository README and CONTRACTS.md; natrix's
source is deliberately not consulted.
"""

import copy
import ipaddress
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
AGENT = HERE / "e2e_agent.py"

# --- the lab's address plan (fixed by `natrix lab up`) ------------------------
NS_NAT = "nx-nat"
NS_SUB1, NS_SUB2 = "nx-sub1", "nx-sub2"
NS_SRV1, NS_SRV2, NS_SRV3 = "nx-srv1", "nx-srv2", "nx-srv3"
ALL_NS = ["nx-sw", NS_NAT, NS_SUB1, NS_SUB2, NS_SRV1, NS_SRV2, NS_SRV3]
SUB1, SUB2 = "100.64.0.2", "100.64.0.3"
SRV1, SRV2, SRV3 = "198.51.100.11", "198.51.100.12", "198.51.100.13"
INSIDE_PREFIX = ipaddress.ip_network("100.64.0.0/10")
SUBSCRIBERS = str(INSIDE_PREFIX)
NAT_OUTSIDE = "198.51.100.1"

# Ports the helper servers listen on, in every server namespace.
UDP_ECHO = 7000
UDP_ECHO2 = 7001
TCP_REPORT = 7100
HTTP_PORT = 8080

DEFAULT_API = "127.0.0.1:9300"
# What `natrix run` prints once it forwards ("already in use" must not pass for it).
READY_LINE = "natrix: ready:"

# How long to wait for something that must not happen.
QUIET = 1.5


def natrix_bin():
    env = os.environ.get("NATRIX_BIN")
    return Path(env) if env else REPO_ROOT / "target" / "debug" / "natrix"


def skip_reason():
    """Why the e2e tests are skipped here, or None: only for want of root.
    Where root is available (CI), a missing tool or binary is a failure,
    reported by `setup_problem`, never a silent skip."""
    if os.geteuid() != 0:
        return "natrix e2e tests need root (they create network namespaces)"
    return None


def setup_problem():
    """What stops the e2e tests from running as root, or None."""
    for tool in ("ip",):
        if shutil.which(tool) is None:
            return f"natrix e2e tests need `{tool}` (iproute2), not found in PATH"
    b = natrix_bin()
    if not b.exists():
        return (f"natrix binary not found at {b}: build it with `cargo build -p natrix` "
                "or set NATRIX_BIN")
    if not os.access(b, os.X_OK):
        return f"natrix binary {b} is not executable"
    return None


def clean_env():
    """Environment for child processes: no proxies (curl must go direct)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return env


def netns_cmd(ns, *argv):
    return ["ip", "netns", "exec", ns, *map(str, argv)]


def sh(*argv, ns=None, check=True, timeout=20):
    """Runs a command, in namespace `ns` if given; raises with its stderr
    when it fails and `check` is set."""
    cmd = netns_cmd(ns, *argv) if ns else list(map(str, argv))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p


def run_in(ns, *argv, timeout=10, check=False):
    return subprocess.run(netns_cmd(ns, *argv), capture_output=True, text=True,
                          timeout=timeout, check=check, env=clean_env())


def in_pool(addr, pool):
    a = ipaddress.ip_address(addr)
    return any(a in ipaddress.ip_network(p, strict=False) for p in pool)


def is_inside(addr):
    return ipaddress.ip_address(addr) in INSIDE_PREFIX


# --- config -------------------------------------------------------------------

def deep_merge(base, overrides):
    out = copy.deepcopy(base)
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not _inline(v):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class Inline(dict):
    """A dict written as a TOML inline table (e.g. max_ports_per_protocol)."""


# Router mode's overrides of the lab config: an inline table replaces the
# lab's [nat] whole (pool, ports and filtering are refused with translation
# off).
ROUTER_MODE = {"nat": Inline(mode="off")}


def _inline(v):
    return isinstance(v, Inline)


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(cfg):
    lines = []
    for k, v in cfg.items():
        if not (isinstance(v, dict) and not _inline(v)):
            lines.append(f"{k} = {_toml_value(v)}")
    for k, v in cfg.items():
        if isinstance(v, dict) and not _inline(v):
            lines.append("")
            lines.append(f"[{k}]")
            for kk, vv in v.items():
                if isinstance(vv, dict) and not _inline(vv):
                    raise TypeError("nested tables deeper than one level are not used here")
                lines.append(f"{kk} = {_toml_value(vv)}")
    return "\n".join(lines) + "\n"


# --- natrix process -------------------------------------------------------------

class _Lines:
    """Collects a pipe's lines in a thread."""

    def __init__(self, pipe):
        self.lines = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe):
        for raw in iter(pipe.readline, b""):
            with self.cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def text(self):
        with self.cond:
            return "\n".join(self.lines)


def with_arrangement(config):
    """`config` with the I/O backend, worker count and XDP mode that
    NATRIX_E2E_IO, NATRIX_E2E_WORKERS and NATRIX_E2E_XDP_MODE ask for, where
    the test leaves them to the default, so that the whole suite can run in
    each arrangement natrix supports."""
    config = dict(config)
    for key, var, parse in (("io", "NATRIX_E2E_IO", str), ("workers", "NATRIX_E2E_WORKERS", int), ("xdp_mode", "NATRIX_E2E_XDP_MODE", str)):
        if os.environ.get(var):
            config.setdefault(key, parse(os.environ[var]))
    return config


class Natrix:
    """`natrix run --config FILE` inside nx-nat, or inside `ns` for tests
    that build a topology of their own."""

    def __init__(self, config, path, ns=NS_NAT):
        self.config = config = with_arrangement(config)
        self.ns = ns
        self.path = Path(path)
        self.path.write_text(to_toml(config))
        self.proc = subprocess.Popen(
            netns_cmd(ns, natrix_bin(), "run", "--config", self.path),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env=clean_env())
        self.out = _Lines(self.proc.stdout)
        self.err = _Lines(self.proc.stderr)

    @property
    def pool(self):
        return self.config["nat"]["pool"]

    @property
    def api(self):
        return self.config.get("management", {}).get("listen")

    def output(self):
        return (f"--- natrix stdout ---\n{self.out.text()[-4000:]}\n"
                f"--- natrix stderr ---\n{self.err.text()[-6000:]}\n"
                f"--- config {self.path} ---\n{self.path.read_text()}")

    def wait_ready(self, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for src in (self.out, self.err):
                with src.cond:
                    if any(READY_LINE in line for line in src.lines):
                        return
            rc = self.proc.poll()
            if rc is not None:
                time.sleep(0.2)  # let the readers drain
                raise RuntimeError(f"natrix run exited with status {rc} before printing "
                                   f"'ready'\n{self.output()}")
            time.sleep(0.05)
        raise TimeoutError(f"natrix run printed no line containing 'ready' within "
                           f"{timeout:.0f} s\n{self.output()}")

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stderr_since(self, n_lines):
        with self.err.cond:
            return self.err.lines[n_lines:]

    def stderr_len(self):
        with self.err.cond:
            return len(self.err.lines)

    def stop(self, timeout=10.0):
        """SIGTERM; returns the exit status (None if it had to be killed)."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
            return None

    def cli(self, *args, timeout=10):
        """Runs `natrix ARGS` inside natrix's namespace (with `--api LISTEN`
        when the config's management address is not the default)."""
        argv = [natrix_bin(), *args]
        if self.api and self.api != DEFAULT_API:
            argv += ["--api", self.api]
        return run_in(self.ns, *argv, timeout=timeout)


# --- agents -----------------------------------------------------------------------

class AgentError(Exception):
    def __init__(self, op, resp):
        self.errno = resp.get("errno")
        self.elapsed = resp.get("elapsed")
        super().__init__(f"{op}: {self.errno}: {resp.get('error')}")


class Agent:
    """Client for e2e_agent.py running in namespace `ns`."""

    def __init__(self, ns):
        self.ns = ns
        self.proc = subprocess.Popen(
            netns_cmd(ns, sys.executable, "-u", AGENT),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=clean_env())
        self.replies = queue.Queue()
        self.err = _Lines(self.proc.stderr)
        threading.Thread(target=self._read, daemon=True).start()
        self.seq = 0
        self.call("ping", _timeout=10)

    def _read(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.replies.put(json.loads(raw))
        self.replies.put(None)

    def call(self, op, _timeout=None, **kw):
        self.seq += 1
        rid = self.seq
        req = dict(kw, id=rid, op=op)
        wait = _timeout if _timeout is not None else float(kw.get("timeout", 3.0)) + 5.0
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(f"agent in {self.ns} died:\n{self.err.text()}")
        while True:
            try:
                resp = self.replies.get(timeout=wait)
            except queue.Empty:
                raise RuntimeError(f"agent in {self.ns} did not answer {op} within {wait} s")
            if resp is None:
                raise RuntimeError(f"agent in {self.ns} exited:\n{self.err.text()}")
            if resp["id"] == rid:
                break
        if not resp["ok"]:
            raise AgentError(op, resp)
        return resp["result"]

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=3)

    # -- conveniences --
    def udp_open(self, bind_port=0, connect=None, recverr=False):
        return self.call("udp_open", bind_port=bind_port,
                         connect=list(connect) if connect else None, recverr=recverr)["sid"]

    def udp_send(self, sid, data, to=None):
        self.call("udp_send", sid=sid, data=data, to=list(to) if to else None)

    def udp_recv(self, sid, timeout=2.0):
        """(data, (ip, port)), or raises AgentError (errno TIMEOUT, ECONNREFUSED...)."""
        r = self.call("udp_recv", sid=sid, timeout=timeout)
        return r["data"], tuple(r["from"])

    def udp_expect_nothing(self, sid, timeout=QUIET):
        """Returns whatever arrived within `timeout` (None if nothing did)."""
        try:
            return self.udp_recv(sid, timeout=timeout)
        except AgentError as e:
            if e.errno == "TIMEOUT":
                return None
            raise

    def echo(self, sid, server, data, tries=3, timeout=1.0):
        """Sends `data` to a UDP echo server and returns the peer address the
        server saw, (ip, port). Retries a few times (the first packet may wait
        for ARP); raises AgentError on an ICMP error or silence."""
        last = None
        for _ in range(tries):
            self.udp_send(sid, data, to=server)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    got, src = self.udp_recv(sid, timeout=max(0.05, deadline - time.monotonic()))
                except AgentError as e:
                    last = e
                    if e.errno == "TIMEOUT":
                        break
                    raise
                reply = json.loads(got)
                if reply["data"] == data:
                    assert src == tuple(server), (
                        f"echo reply came from {src}, expected the server's own address "
                        f"{tuple(server)} (inbound translation back to the remote endpoint)")
                    return tuple(reply["peer"])
        raise last

    def tcp_connect(self, to, bind_port=0, reuse=False, timeout=3.0):
        return self.call("tcp_connect", to=list(to), bind_port=bind_port, reuse=reuse,
                         timeout=timeout)

    def tcp_report(self, to, bind_port=0, reuse=False, timeout=3.0):
        """Connects to a tcp_report server; returns (sid, peer the server saw)."""
        r = self.tcp_connect(to, bind_port=bind_port, reuse=reuse, timeout=timeout)
        line = self.call("tcp_recv_line", sid=r["sid"], timeout=timeout)["data"]
        assert line.endswith("\n"), f"no report line from TCP server {to}: {line!r}"
        return r["sid"], tuple(json.loads(line)["peer"])

    def events(self, server):
        return self.call("server_events", server=server)["events"]


class Tshark:
    """tshark capturing on `iface` in namespace `ns` into `path` (pcapng)
    with the capture filter `bpf`, from construction until `stop()`; then
    `fields()` decodes the file with tshark."""

    def __init__(self, ns, iface, bpf, path):
        self.path = Path(path)
        self.proc = subprocess.Popen(netns_cmd(ns, "tshark", "-i", iface, "-w", self.path, "-f", bpf),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=clean_env())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if "Capturing on" in line or not line:
                break
        time.sleep(0.3)

    def stop(self):
        """Ends the capture (after a moment for the last frames)."""
        if self.proc.poll() is None:
            time.sleep(0.5)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def fields(self, display_filter, *fields, occurrence="a"):
        """One list per frame matching `display_filter`: each of `fields` as
        tshark prints it ("" when absent; `occurrence` "a": every occurrence,
        comma-separated, "f": the first)."""
        self.stop()
        out = subprocess.run(["tshark", "-r", str(self.path), "-Y", display_filter, "-T", "fields", "-E", f"occurrence={occurrence}",
                              *[a for f in fields for a in ("-e", f)]],
                             capture_output=True, text=True, timeout=60, env=clean_env())
        if out.returncode != 0:
            raise RuntimeError(f"tshark -r {self.path} failed: {out.stderr}")
        return [(line.split("\t") + [""] * len(fields))[:len(fields)] for line in out.stdout.splitlines()]


def ensure_lab_namespaces():
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           timeout=10).stdout
    present = {line.split()[0] for line in names.splitlines() if line.strip()}
    return [ns for ns in ALL_NS if ns not in present]


AF_XDP = 44  # AF_XDP's address family (linux/socket.h); Python's socket module has no name for it


def af_xdp_unavailable():
    """Why AF_XDP sockets cannot be made here, or None."""
    try:
        socket.socket(AF_XDP, socket.SOCK_RAW, 0).close()
    except OSError as e:
        return f"AF_XDP sockets are unavailable in this kernel ({e})"
    return None


def skip_module_if_unavailable():
    """Module-level skip (at collection) when the e2e tests cannot run here."""
    import pytest
    reason = skip_reason()
    if reason:
        pytest.skip(reason, allow_module_level=True)


def udp_burst(a, count, server, tag, gap=0.02):
    """Opens `count` UDP sockets in agent `a`, each connected to the echo
    `server`, sends one datagram from each in order, and collects the answers.
    Returns a list with, per socket, ("ok", peer_seen_by_server, sid) or
    ("err", errno, sid) (errno "TIMEOUT" for silence, "EHOSTUNREACH" for an
    ICMP host unreachable...). Datagrams that got no answer at all are sent
    once more, so one lost frame does not count as a refusal."""
    sids = [a.udp_open(connect=server, recverr=True) for _ in range(count)]

    def send(i):
        a.udp_send(sids[i], f"{tag}-{i}")

    def collect(i, timeout):
        want = f"{tag}-{i}"
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                data, _src = a.udp_recv(sids[i], timeout=max(0.05, left))
            except AgentError as e:
                return ("err", e.errno, sids[i])
            reply = json.loads(data)
            if reply["data"] == want:
                return ("ok", tuple(reply["peer"]), sids[i])
            if left <= 0:
                return ("err", "TIMEOUT", sids[i])

    for i in range(count):
        send(i)
        time.sleep(gap)
    results = [collect(i, 1.5 if i == 0 else 0.3) for i in range(count)]
    silent = [i for i, r in enumerate(results) if r[0] == "err" and r[1] == "TIMEOUT"]
    for i in silent:
        send(i)
        time.sleep(gap)
    for n, i in enumerate(silent):
        results[i] = collect(i, 1.0 if n == 0 else 0.3)
    return results
