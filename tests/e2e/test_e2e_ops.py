"""Operating a live natrix: `natrix show` / `natrix clear` over the
management API, and configuration reload on SIGHUP (CONTRACTS.md, #4/#6)."""

import json
import signal
import subprocess
import time

import e2e_harness as h
from e2e_harness import NS_SUB1, NS_SUB2, SRV1, SRV2, SUB1, SUB2

h.skip_module_if_unavailable()


def _records(doc):
    """The list of records in a `show --json` answer: the document itself if
    it is a list, else the first list found among an object's values."""
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        for v in doc.values():
            if isinstance(v, list):
                return v
        for v in doc.values():
            if isinstance(v, dict):
                found = _records(v)
                if found is not None:
                    return found
        return []
    raise AssertionError(f"unexpected JSON document: {doc!r}")


def _show(n, what, *extra):
    r = n.cli("show", what, "--json", *extra)
    assert r.returncode == 0, (f"`natrix show {what} --json {' '.join(extra)}` failed "
                               f"({r.returncode}):\n{r.stdout}\n{r.stderr}")
    try:
        return json.loads(r.stdout)
    except ValueError:
        raise AssertionError(f"`natrix show {what} --json` printed no JSON:\n{r.stdout[:2000]}")


def _mentions(record, *needles):
    text = json.dumps(record)
    return all(str(x) in text for x in needles)


def test_show_and_clear_sessions(natrix, agent, servers):
    """`show sessions --json` lists sub1's session (inside address, remote,
    external address); `--subscriber` restricts to one subscriber; `clear
    sessions --subscriber 100.64.0.2` removes sub1's sessions and only them."""
    n = natrix()
    sub1, sub2 = agent(NS_SUB1), agent(NS_SUB2)
    e1 = sub1.echo(sub1.udp_open(), (SRV1, h.UDP_ECHO), "show-me")
    e2 = sub2.echo(sub2.udp_open(), (SRV2, h.UDP_ECHO), "and-me")

    sessions = _records(_show(n, "sessions"))
    mine = [s for s in sessions if _mentions(s, SUB1)]
    assert mine, f"no session of {SUB1} in `show sessions --json`: {sessions[:10]}"
    assert any(_mentions(s, SRV1, e1[0], e1[1]) for s in mine), (
        f"sub1's session does not show remote {SRV1} and external {e1}: {mine}")
    assert any(_mentions(s, SUB2, e2[0]) for s in sessions), (
        f"sub2's session missing from `show sessions --json`: {sessions[:10]}")

    only = _records(_show(n, "sessions", "--subscriber", SUB1))
    assert only and all(_mentions(s, SUB1) for s in only), (
        f"`show sessions --subscriber {SUB1}` gave {only}")
    assert not any(_mentions(s, SUB2) for s in only), (
        f"`show sessions --subscriber {SUB1}` lists another subscriber: {only}")

    mappings = _records(_show(n, "mappings", "--subscriber", SUB1))
    assert any(_mentions(m, SUB1, e1[0], e1[1]) for m in mappings), (
        f"`show mappings --subscriber {SUB1}` lacks the mapping to {e1}: {mappings}")
    _show(n, "stats")  # must at least be JSON

    args = ["clear", "sessions", "--subscriber", SUB1]
    r = n.cli(*args)
    assert r.returncode == 0, f"`natrix {' '.join(args)}` failed:\n{r.stdout}\n{r.stderr}"

    after = _records(_show(n, "sessions", "--subscriber", SUB1))
    assert not [s for s in after if _mentions(s, SUB1)], (
        f"sessions of {SUB1} still listed after clear: {after}")
    everyone = _records(_show(n, "sessions"))
    assert any(_mentions(s, SUB2) for s in everyone), (
        f"clearing {SUB1} also removed {SUB2}'s session: {everyone}")


def _reload(n, overrides, settle=1.5):
    """Writes the running config merged with `overrides` to natrix's config
    file, sends SIGHUP and returns natrix's new stderr lines."""
    n.config = h.deep_merge(n.config, overrides)
    n.path.write_text(h.to_toml(n.config))
    before = n.stderr_len()
    n.signal(signal.SIGHUP)
    time.sleep(settle)
    assert n.alive(), f"natrix exited on SIGHUP\n{n.output()}"
    return n.stderr_since(before)


def test_sighup_reload(natrix, agent, servers):
    """SIGHUP applies a new policy live (max_ports_per_subscriber lowered to
    3: sub1, holding one mapping, gets exactly 2 more) without disturbing
    existing flows; an invalid config or an interface change is refused with
    a message on stderr and natrix keeps running with its old config."""
    n = natrix({"nat": {"max_ports_per_subscriber": 2000}})
    sub1 = agent(NS_SUB1)
    echo = (SRV1, h.UDP_ECHO)
    s0 = sub1.udp_open()
    e0 = sub1.echo(s0, echo, "before-reload")

    _reload(n, {"nat": {"max_ports_per_subscriber": 3}})
    assert sub1.echo(s0, echo, "after-reload") == e0, "existing mapping changed on reload"
    results = h.udp_burst(sub1, 5, echo, "post-reload")
    ok = [i for i, r in enumerate(results) if r[0] == "ok"]
    assert ok == [0, 1], (
        "after reloading with max_ports_per_subscriber = 3, sub1 (already holding one "
        f"mapping) should get exactly 2 more; got {[(r[0], r[1]) for r in results]}")

    good = dict(n.config)
    new_err = _reload(n, {"nat": {"filtering": "no-such-filtering"}})
    assert any("filtering" in line for line in new_err), (
        f"invalid config on SIGHUP: stderr does not name the key `filtering`: {new_err}")
    assert sub1.echo(s0, echo, "after-bad-reload") == e0

    n.config = good
    new_err = _reload(n, {"inside": {"interface": "nx-no-such-if"}})
    assert any("restart" in line.lower() for line in new_err), (
        f"interface change on SIGHUP: stderr does not say a restart is needed: {new_err}")
    assert sub1.echo(s0, echo, "after-iface-reload") == e0


def test_a_rotated_json_log_is_let_go_at_sighup_even_when_the_reload_is_refused(natrix, agent, servers, tmp_path):
    """logrotate moves the JSON log away and sends SIGHUP: natrix opens the
    file again, so the next mapping is logged there, not in the moved file,
    even when the configuration it reads is refused (an interface changed)."""
    log = tmp_path / "events.jsonl"
    n = natrix({"logging": {"json": str(log)}})
    sub1 = agent(NS_SUB1)
    echo = (SRV1, h.UDP_ECHO)
    sub1.echo(sub1.udp_open(), echo, "before-rotation")
    time.sleep(1.5)  # the logger flushes every second
    rotated = tmp_path / "events.jsonl.1"
    log.rename(rotated)
    err = _reload(n, {"inside": {"interface": "nx-no-such-if"}})
    assert any("restart" in line.lower() for line in err), f"the reload should be refused: {err}"
    port = sub1.echo(sub1.udp_open(), echo, "after-rotation")[1]
    time.sleep(1.5)
    assert log.exists(), "natrix did not open the log again at SIGHUP"
    created = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(r["event"] == "mapping_create" and r.get("external_port") == port for r in created), (
        f"the mapping made after the rotation is not in the new file: {created}")
    moved = [json.loads(line) for line in rotated.read_text().splitlines()]
    assert moved and not any(r.get("external_port") == port for r in moved), f"the moved file took a record after the rotation: {moved}"


def test_whois_does_not_name_a_crashed_runs_subscriber_after_the_restart(natrix, agent, servers, tmp_path):
    """natrix killed (SIGKILL) logs no deletion of the mapping it held; the
    next `natrix run` marks its start in the log, and `natrix whois` names
    the subscriber up to that start and nobody after it (exit 1)."""
    log = tmp_path / "events.jsonl"
    n = natrix({"logging": {"json": str(log)}})
    sub1 = agent(NS_SUB1)
    ext = sub1.echo(sub1.udp_open(), (SRV1, h.UDP_ECHO), "before-the-crash")
    time.sleep(1.5)  # the logger flushes every second
    n.proc.kill()
    n.proc.wait(timeout=10)
    n.reported = True  # killed on purpose
    time.sleep(1.1)
    between = time.time()
    time.sleep(1.1)
    natrix({"logging": {"json": str(log)}})
    after = time.time() + 1

    def whois(at):
        return subprocess.run([str(h.natrix_bin()), "whois", f"{ext[0]}:{ext[1]}", "--proto", "udp", "--log", str(log), "--at", f"{at:.3f}", "--json"],
                              capture_output=True, text=True, timeout=20)
    held = whois(between)
    assert held.returncode == 0 and SUB1 in held.stdout, f"whois before the restart:\n{held.stdout}{held.stderr}"
    nobody = whois(after)
    assert nobody.returncode == 1, f"whois after the restart still names someone:\n{nobody.stdout}{nobody.stderr}"


def test_a_clean_stop_logs_the_deletion_of_every_session_and_mapping(natrix, tmp_path):
    """A stop ends more sessions at once than the engine queues between two
    drains (65,536 a worker): the JSON log (unit "session") still gets a
    deletion for every session and mapping it logged as created (README,
    "Logging": a clean stop logs each as deleted). `natrix gen` opens
    80,000 UDP flows from 16 subscribers (sessions; endpoint-independent
    mapping makes far fewer mappings)."""
    log = tmp_path / "events.jsonl"
    n = natrix({"nat": {"max_ports_per_subscriber": 64512, "max_sessions_per_subscriber": 200000},
                "logging": {"json": str(log), "unit": "session"}})
    mac = h.sh("cat", "/sys/class/net/inside/address", ns=h.NS_NAT).stdout.strip()
    flows, rate = 80000, 40000
    h.sh(h.natrix_bin(), "gen", "--interface", "eth0", "--dst-mac", mac, "--src", "100.64.1.1", "--subscribers", "16",
         "--dst", SRV1, "--new-flows", "1", "--rate", str(rate), "--duration", str(flows / rate), "--json", ns=NS_SUB1, timeout=60)

    def counts():
        lines = log.read_text().splitlines() if log.exists() else []
        events = [json.loads(line)["event"] for line in lines if line.endswith("}")]
        return {e: events.count(e) for e in ("session_create", "session_delete", "mapping_create", "mapping_delete")}
    deadline = time.monotonic() + 10
    while counts()["session_create"] < flows * 0.9 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert counts()["session_create"] > 70000, f"only {counts()} logged of the {flows} flows sent: {n.cli('show', 'stats', '--json').stdout}"
    rc = n.stop()
    n.reported = True  # stopped here on purpose; its status is checked
    assert rc == 0, f"natrix stopped with {rc}\n{n.output()}"
    c = counts()
    print(f"\nstop: {c}")
    assert c["session_delete"] == c["session_create"] and c["mapping_delete"] == c["mapping_create"], f"not every deletion logged at the stop: {c}"
