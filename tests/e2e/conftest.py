"""Fixtures for natrix's end-to-end tests in the lab of `natrix lab up`.

Needs root, iproute2 and the natrix binary ($NATRIX_BIN, else
<repo>/target/debug/natrix); without them every test module here is skipped
with the reason shown in the header and in the skip summary (-rs).

- `lab` (session): `natrix lab up --config-out FILE` once, `natrix lab down`
  at the end whatever happens; yields the lab's config as a dict.
- `natrix` (function): a factory, `natrix(overrides)` writes the lab config
  merged with `overrides` to a temp file, runs `natrix run` in nx-nat, waits
  for `ready` (20 s, failing with natrix's output) and at teardown stops it
  with SIGTERM and checks it exits 0.
- `agent` (function): a factory, `agent("nx-sub1")` is a socket agent in
  that namespace (e2e_agent.py), closed at teardown with all its sockets and
  servers.
- `servers` (function): UDP echo (7000, 7001) and TCP report (7100) servers in
  nx-srv1..3, i.e. `servers[SRV1]` is the agent in nx-srv1;
  `servers[SRV1].server_ids["udp_echo"]` names its echo server for `.events()`.
"""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import e2e_harness as h  # noqa: E402

SKIP = h.skip_reason()
if SKIP:
    print(f"\nnatrix e2e tests skipped: {SKIP}", file=sys.stderr)


def pytest_report_header(config):
    if SKIP:
        return [f"natrix e2e: SKIPPED ({SKIP})"]
    return [f"natrix e2e: binary {h.natrix_bin()}"]


def pytest_collection_modifyitems(config, items):
    if not SKIP:
        return
    mark = pytest.mark.skip(reason=SKIP)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(mark)


def _natrix_cli(*args, timeout=120):
    return subprocess.run([str(h.natrix_bin()), *args], capture_output=True, text=True,
                          timeout=timeout, env=h.clean_env())


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    problem = h.setup_problem()
    assert problem is None, problem
    cfg_path = tmp_path_factory.mktemp("lab") / "lab.toml"
    proc = _natrix_cli("lab", "up", "--config-out", str(cfg_path))
    if proc.returncode != 0 and "lab down" in proc.stderr:
        # A previous run that was killed left the lab behind: rebuild it.
        print(f"\n`natrix lab up` refused ({proc.stderr.strip()}); running `natrix lab down` "
              "and retrying", file=sys.stderr)
        _natrix_cli("lab", "down")
        proc = _natrix_cli("lab", "up", "--config-out", str(cfg_path))
    try:
        if proc.returncode != 0:
            pytest.fail(f"`natrix lab up` failed with status {proc.returncode}:\n"
                        f"{proc.stdout}\n{proc.stderr}", pytrace=False)
        missing = h.ensure_lab_namespaces()
        if missing:
            pytest.fail(f"`natrix lab up` succeeded but namespaces are missing: {missing}",
                        pytrace=False)
        if not cfg_path.exists():
            pytest.fail(f"`natrix lab up --config-out {cfg_path}` wrote no config",
                        pytrace=False)
        config = tomllib.loads(cfg_path.read_text())
        # `natrix lab up` writes natrix's defaults (io "auto", one worker)
        # out; left out here, so that h.with_arrangement can give every
        # test that does not name its own the arrangement NATRIX_E2E_IO
        # and NATRIX_E2E_WORKERS ask for.
        for key in ("io", "workers"):
            config.pop(key, None)
        yield config
    finally:
        down = _natrix_cli("lab", "down")
        if down.returncode != 0:
            print(f"warning: `natrix lab down` failed ({down.returncode}): {down.stderr}",
                  file=sys.stderr)


@pytest.fixture
def natrix(lab, tmp_path):
    started = []

    def start(overrides=None, ready_timeout=20.0):
        config = h.deep_merge(lab, overrides or {})
        n = h.Natrix(config, tmp_path / f"natrix-{len(started)}.toml")
        started.append(n)
        problem = None
        try:
            n.wait_ready(timeout=ready_timeout)
        except (TimeoutError, RuntimeError) as e:
            problem = str(e)
        if problem:
            n.reported = True  # the test fails with this; teardown need not repeat it
            n.stop()
            pytest.fail(problem, pytrace=False)
        return n

    yield start

    problems = []
    for n in started:
        if getattr(n, "reported", False):
            continue
        was_alive = n.alive()
        rc = n.stop()
        if not was_alive:
            problems.append(f"natrix died during the test with status {rc}\n{n.output()}")
        elif rc is None:
            problems.append(f"natrix did not exit within 10 s of SIGTERM\n{n.output()}")
        elif rc != 0:
            problems.append(f"natrix exited with status {rc} on SIGTERM (expected 0)\n"
                            f"{n.output()}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def agent(lab):
    agents = {}

    def get(ns):
        if ns not in agents:
            agents[ns] = h.Agent(ns)
        return agents[ns]

    yield get
    for a in agents.values():
        a.close()


@pytest.fixture
def servers(agent):
    out = {}
    for ns, addr in ((h.NS_SRV1, h.SRV1), (h.NS_SRV2, h.SRV2), (h.NS_SRV3, h.SRV3)):
        a = agent(ns)
        a.server_ids = {
            "udp_echo": a.call("udp_echo_server", port=h.UDP_ECHO)["server"],
            "udp_echo2": a.call("udp_echo_server", port=h.UDP_ECHO2)["server"],
            "tcp_report": a.call("tcp_report_server", port=h.TCP_REPORT)["server"],
        }
        out[addr] = a
    return out


@pytest.fixture
def routed_to_subscribers(lab):
    """The servers' route to the subscribers' own addresses (100.64.0.0/10
    via natrix's outside address) for the test's length: what router mode
    (`[nat] mode = "off"`) needs, since nothing is translated."""
    routed = []
    try:
        for ns in (h.NS_SRV1, h.NS_SRV2, h.NS_SRV3):
            r = h.run_in(ns, "ip", "route", "replace", h.SUBSCRIBERS, "via", h.NAT_OUTSIDE)
            assert r.returncode == 0, f"adding {h.SUBSCRIBERS} via {h.NAT_OUTSIDE} in {ns}: {r.stderr}"
            routed.append(ns)
        yield
    finally:
        for ns in routed:
            h.run_in(ns, "ip", "route", "del", h.SUBSCRIBERS, "via", h.NAT_OUTSIDE)
