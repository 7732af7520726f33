"""One natrix per interface (issue 16 item 2): a second `natrix run` on
interfaces another natrix already uses refuses to start, naming the
interface and the PID of the natrix that holds it (a lock file under
/run/natrix, named by interface and network namespace); the first keeps
forwarding. The lock goes with its holder: after a clean stop (SIGTERM) or a
SIGKILL, the next natrix starts normally."""

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

import e2e_harness as h
from e2e_harness import NS_NAT, NS_SUB1, SRV1

h.skip_module_if_unavailable()

LOCK_DIR = Path("/run/natrix")
ECHO = (SRV1, h.UDP_ECHO)


class Run:
    """`natrix run --config PATH` in namespace `ns`, its output collected."""

    def __init__(self, ns, config, path, preexec_fn=None):
        self.path = Path(path)
        self.path.write_text(h.to_toml(config))
        self.proc = subprocess.Popen(
            h.netns_cmd(ns, h.natrix_bin(), "run", "--config", self.path),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env=h.clean_env(), preexec_fn=preexec_fn)
        self.out = h._Lines(self.proc.stdout)
        self.err = h._Lines(self.proc.stderr)

    def ready(self):
        return any(h.READY_LINE in line for src in (self.out, self.err) for line in src.text().splitlines())

    def wait_exit_or_ready(self, timeout):
        """'exited' or 'ready' or 'timeout'."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the readers drain
                return "exited"
            if self.ready():
                return "ready"
            time.sleep(0.05)
        return "timeout"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode

    def output(self):
        return f"--- stdout ---\n{self.out.text()[-3000:]}\n--- stderr ---\n{self.err.text()[-3000:]}"


def _second_config(lab):
    # Its own management port, so that nothing but the interfaces is shared.
    return h.deep_merge(lab, {"management": {"listen": "127.0.0.1:9301"}})


def _expect_refused(lab, tmp_path, holder_pid, name):
    """Starts another natrix on the lab's interfaces; it must exit non-zero
    at once, naming an interface and the PID of the holder."""
    second = Run(NS_NAT, _second_config(lab), tmp_path / f"{name}.toml")
    try:
        state = second.wait_exit_or_ready(timeout=15)
    finally:
        rc = second.stop()
    assert state == "exited", (
        f"a second natrix on interfaces in use did not refuse to start ({state})\n{second.output()}")
    assert rc != 0, f"the second natrix exited with status 0\n{second.output()}"
    err = second.err.text()
    ifaces = (lab["inside"]["interface"], lab["outside"]["interface"])
    assert any(i in err for i in ifaces), f"stderr names neither interface {ifaces}:\n{err}"
    assert str(holder_pid) in err, f"stderr does not name the PID {holder_pid} of the natrix holding them:\n{err}"


def _forwards(sub1, sid, expect=None):
    peer = sub1.echo(sid, ECHO, f"lock-{time.monotonic()}")
    assert h.in_pool(peer[0], ["203.0.113.0/28", "198.51.100.10/32"]) and not h.is_inside(peer[0]), peer
    if expect is not None:
        assert peer == expect, f"the mapping changed: {expect} -> {peer}"
    return peer


def test_second_natrix_on_the_same_interfaces_is_refused(lab, natrix, agent, servers, tmp_path):
    n = natrix()
    sub1 = agent(NS_SUB1)
    sid = sub1.udp_open()
    before = _forwards(sub1, sid)

    names = [p.name for p in LOCK_DIR.iterdir()] if LOCK_DIR.is_dir() else []
    for iface in (lab["inside"]["interface"], lab["outside"]["interface"]):
        assert any(iface in name for name in names), (
            f"no lock file under {LOCK_DIR} named after interface {iface!r}: {names}")

    _expect_refused(lab, tmp_path, n.proc.pid, "second")
    assert n.alive(), f"the first natrix died when a second one tried to start\n{n.output()}"
    _forwards(sub1, sid, expect=before)

    # The refused one must not have taken the lock away from the first.
    _expect_refused(lab, tmp_path, n.proc.pid, "third")
    assert n.alive()
    _forwards(sub1, sid, expect=before)


def test_lock_is_released_by_a_clean_stop(natrix, agent, servers):
    n = natrix()
    sub1 = agent(NS_SUB1)
    _forwards(sub1, sub1.udp_open())
    assert n.stop() == 0, n.output()
    n.reported = True  # stopped here on purpose; its status was checked
    n2 = natrix()  # fails the test unless it prints `ready`
    _forwards(sub1, sub1.udp_open())
    assert n2.alive()


def test_lock_of_a_killed_natrix_does_not_block_the_next(natrix, agent, servers):
    """Nor does its XDP program: attached through a BPF link, it goes with
    the process, so the next natrix gets AF_XDP again rather than falling
    back to AF_PACKET behind a program nobody serves."""
    n = natrix()
    sub1 = agent(NS_SUB1)
    _forwards(sub1, sub1.udp_open())
    n.proc.kill()  # SIGKILL: no chance to clean up
    n.proc.wait(timeout=10)
    n.reported = True  # killed on purpose: not a teardown failure
    n2 = natrix()
    _forwards(sub1, sub1.udp_open())
    assert n2.alive()
    # Kernels before 5.9 have no XDP links: natrix attaches over rtnetlink there.
    if _backend(n) == "af_xdp" and _kernel() >= (5, 9):
        assert _backend(n2) == "af_xdp", f"the killed natrix's XDP program stayed behind:\n{n2.output()}"


def _kernel():
    """The running kernel's (major, minor)."""
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _backend(n):
    """The backend natrix's ready line names."""
    for line in (n.out.text() + n.err.text()).splitlines():
        if h.READY_LINE in line and "(" in line:
            return line.rsplit("(", 1)[1].split(",")[0]
    return None


def _limit_as():
    resource.setrlimit(resource.RLIMIT_AS, (2_000_000_000, 2_000_000_000))


def test_a_natrix_that_cannot_start_leaves_no_lock(lab, natrix, agent, servers, tmp_path):
    """`natrix run` refuses cleanly when the memory its max_sessions reserves
    cannot be had (issue 16 item 5), and that refusal leaves no lock behind:
    the next natrix starts."""
    cfg = h.deep_merge(lab, {"nat": {"max_sessions": 268435456}})
    big = Run(NS_NAT, cfg, tmp_path / "big.toml", preexec_fn=_limit_as)
    try:
        state = big.wait_exit_or_ready(timeout=20)
    finally:
        rc = big.stop()
    out = big.output()
    assert state == "exited", f"natrix run under a 2 GB address-space limit did not refuse ({state})\n{out}"
    assert rc in (1, 2), f"exit {rc}, expected 1 or 2 (negative: killed by a signal)\n{out}"
    err = big.err.text()
    assert "memory" in err.lower() and "max_sessions" in err, out
    assert "panicked" not in out and "backtrace" not in out.lower(), out
    natrix()
    sub1 = agent(NS_SUB1)
    _forwards(sub1, sub1.udp_open())


NS_OTHER = "nx-locktest"


@pytest.fixture
def other_netns():
    """A namespace of its own with interfaces named like the lab's (veth pairs)."""
    subprocess.run(["ip", "netns", "del", NS_OTHER], capture_output=True)
    subprocess.run(["ip", "netns", "add", NS_OTHER], check=True, capture_output=True)
    try:
        for cmd in (["ip", "link", "set", "lo", "up"],
                    ["ip", "link", "add", "inside", "type", "veth", "peer", "name", "inside-peer"],
                    ["ip", "link", "add", "outside", "type", "veth", "peer", "name", "outside-peer"],
                    ["ip", "link", "set", "inside-peer", "up"],
                    ["ip", "link", "set", "outside-peer", "up"],
                    ["ip", "link", "set", "inside", "up"],
                    ["ip", "link", "set", "outside", "up"]):
            h.run_in(NS_OTHER, *cmd, check=True)
        yield NS_OTHER
    finally:
        subprocess.run(["ip", "netns", "del", NS_OTHER], capture_output=True)


def test_same_interface_names_in_another_namespace_do_not_conflict(lab, natrix, other_netns, tmp_path):
    """The lock is per network namespace: interfaces called `inside` and
    `outside` in another namespace are other interfaces."""
    assert (lab["inside"]["interface"], lab["outside"]["interface"]) == ("inside", "outside"), lab
    n = natrix()
    cfg = h.deep_merge(lab, {"io": "af_packet"})
    other = Run(other_netns, cfg, tmp_path / "other.toml")
    try:
        state = other.wait_exit_or_ready(timeout=20)
        assert state == "ready", (
            f"natrix on `inside`/`outside` of namespace {other_netns} did not start while "
            f"another natrix holds the interfaces of the same names in {NS_NAT} ({state})\n"
            f"{other.output()}")
    finally:
        rc = other.stop()
    assert rc == 0, other.output()
    assert n.alive()
