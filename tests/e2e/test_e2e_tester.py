"""`natrix test` end to end (issue 23): the tester measures the Linux
kernel's nftables NAT in the namespace lab with its quick profile, and
produces every result the contract names and both plots.

Written from CONTRACTS.md ("Tester": one JSON object per result line with
`test`, `dut`, `frame_size`, `flows`, `criterion` and the result fields of
RFC 9693, RFC 2544, RFC 8219 and seed 002) and the README's "Measuring"
section (results.jsonl, rate-vs-flows.svg and latency.svg in --out; the
tester builds the lab and removes what it built). Only the shape and the
sanity of the results are checked: speed is for benchmarks.
"""

import json
import os
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET

import pytest

import e2e_harness as h

h.skip_module_if_unavailable()

# Per test, the fields its result object must carry (CONTRACTS.md).
RESULT_FIELDS = {
    "connection_rate": ["rate_pps"],
    "teardown_rate": ["rate_cps"],
    "table_capacity": ["rate_pps", "flows"],
    "throughput": ["rate_pps"],
    "frame_loss": ["loss", "rate_pps"],
    "latency": ["median_us", "p999_us"],
    "pdv": ["pdv_us"],
    "goodput": ["rtt_ms", "jitter_ms"],
}
COMMON_FIELDS = ["test", "dut", "frame_size", "flows", "criterion"]
# The quick profile's connections (README, "Measuring").
QUICK_FLOWS = 256


def lab_up():
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return any(line.split()[0].startswith("nx-") for line in listing.splitlines() if line.strip())


def natrix_cli(*args, timeout=120):
    return subprocess.run([str(h.natrix_bin()), *args], capture_output=True, text=True, timeout=timeout,
                          env=h.clean_env())


@pytest.fixture
def no_lab(tmp_path):
    """`natrix test --dut kernel` builds a kernel lab of its own; a natrix
    lab that this session's other tests left up is taken down for it and
    built again afterwards."""
    problem = h.setup_problem()
    assert problem is None, problem
    was_up = lab_up()
    if was_up:
        down = natrix_cli("lab", "down")
        assert down.returncode == 0, down.stderr
    yield
    if was_up:
        up = natrix_cli("lab", "up", "--config-out", str(tmp_path / "restored-lab.toml"))
        assert up.returncode == 0, up.stderr


def test_a_quick_run_against_the_kernel_gives_every_result_and_plot(no_lab, tmp_path):
    if shutil.which("nft") is None:
        pytest.skip("the kernel lab needs nft: apt-get install nftables")
    out = tmp_path / "results"
    proc = natrix_cli("test", "--dut", "kernel", "--quick", "--json", "--out", str(out), timeout=300)
    assert proc.returncode == 0, f"natrix test failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert lines, "no result lines on stdout"

    for line in lines:
        for field in COMMON_FIELDS:
            assert field in line, f"{field} missing from {line}"
        assert line["criterion"] == "zero" or isinstance(line["criterion"], (int, float)), line
        assert isinstance(line[line["test"]], dict), f"no result object under {line['test']!r}: {line}"

    kernel = [line for line in lines if line["dut"] == "kernel"]
    seen = {line["test"] for line in kernel}
    for test, fields in RESULT_FIELDS.items():
        assert test in seen, f"no {test} result; got {sorted(seen)}"
        for line in (l for l in kernel if l["test"] == test):
            for field in fields:
                assert field in line[test], f"{test}: {field} missing from {line[test]}"

    by_test = {t: [l[t] for l in kernel if l["test"] == t] for t in seen}
    assert by_test["connection_rate"][0]["rate_pps"] > 0
    assert by_test["table_capacity"][0]["flows"] >= QUICK_FLOWS
    assert by_test["throughput"][0]["rate_pps"] > 0
    for loss in by_test["frame_loss"]:
        assert 0.0 <= loss["loss"] <= 1.0
    latency = by_test["latency"][0]
    assert 0 < latency["median_us"] <= latency["p999_us"]
    assert by_test["pdv"][0]["pdv_us"] >= 0
    # Seed 002's ladder: ten rungs, labelled as its method, not RFC 9693's.
    goodput = [l for l in kernel if l["test"] == "goodput"]
    assert len(goodput) == 10 and all(l["method"] == "seed 002" for l in goodput)
    assert {l["frame_size"] for l in goodput} == {132, 1518}
    # Every frame that crossed the NAT kept its tag (timestamps included).
    for l in (l for l in kernel if l["test"] == "latency"):
        assert l["latency"]["samples"] > 0

    # The same lines are in results.jsonl.
    saved = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    assert saved == lines

    for name in ("rate-vs-flows.svg", "latency.svg"):
        root = ET.parse(out / name).getroot()
        assert root.tag.endswith("svg"), f"{name}: root element {root.tag}"
        assert root.iter(), name

    assert not lab_up(), "natrix test left its lab behind"


def expected_lab_cpus(workers, cpus):
    """README, "Measuring": the device gets CPUs 1..workers after the
    tester's CPU 0; the lab's own receivers get the CPUs after the
    device's, or CPU 0 where none are left."""
    device = list(range(1, cpus))[:max(workers, 1)]
    if not device:
        return []
    return list(range(device[-1] + 1, cpus)) or [0]


def rps_mask_cpus(mask):
    value = int(mask.strip().replace(",", ""), 16)
    return [cpu for cpu in range(value.bit_length()) if value >> cpu & 1]


def in_switch(*cmd):
    return subprocess.run(["ip", "netns", "exec", "nx-sw", *cmd], capture_output=True, text=True, timeout=10)


# The NAPI threads of the switch's ends of the device's links, by their
# names as the kernel cuts them (15 characters).
SWITCH_NAPI = ("napi/nx-nat-in-", "napi/nx-nat-out")


def napi_threads(prefixes=("napi/inside-", "napi/outside-")):
    """(comm, scheduling class, real-time priority, CPU affinity) of the
    NAPI threads whose names begin with `prefixes` (the kernel cuts a
    thread's name to 15 characters): by default, those of nx-nat's links."""
    ps = subprocess.run(["ps", "-eo", "comm=,cls=,rtprio=,pid="], capture_output=True, text=True, timeout=10).stdout
    found = []
    for line in ps.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0].startswith(prefixes):
            try:
                affinity = os.sched_getaffinity(int(parts[3]))
            except OSError:
                continue
            found.append((parts[0], parts[1], parts[2], affinity))
    return found


def test_natrix_is_measured_with_the_lab_off_its_cpus_and_its_receive_work_at_a_nics_priority(no_lab, tmp_path):
    """While `natrix test --dut natrix` runs: what natrix sends is received
    in nx-sw on the lab's CPUs, not natrix's (RPS on its links' peers);
    the switch runs no IP filtering on bridged frames; and the NAPI
    threads that run veth's XDP for natrix are pinned to natrix's CPU at
    SCHED_FIFO 50, as a NIC's receive work preempts threads."""
    cpus = os.cpu_count()
    if cpus < 2:
        pytest.skip("one CPU: nothing is steered")
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
        proc = subprocess.Popen([str(h.natrix_bin()), "test", "--dut", "natrix", "--quick", "--tests", "cpu", "--json",
                                 "--out", str(tmp_path / "results")],
                                stdout=out_file, stderr=err_file, text=True, env=h.clean_env())
    masks, threads, switch_threads, filtering, bridge_keys, qdiscs, qdisc_reads = {}, {}, [], {}, False, set(), 0
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        for dev in ("nx-nat-in", "nx-nat-out"):
            read = in_switch("cat", f"/sys/class/net/{dev}/queues/rx-0/rps_cpus")
            if read.returncode == 0 and int(read.stdout.strip().replace(",", "") or "0", 16):
                masks[dev] = read.stdout
            found = port_qdiscs(dev)
            if found is not None:
                qdiscs |= found
                qdisc_reads += 1
        bridge_keys = bridge_keys or in_switch("test", "-e", "/proc/sys/net/bridge").returncode == 0
        for key in ("net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"):
            got = in_switch("sysctl", "-n", key)
            if got.returncode == 0:
                filtering[key] = got.stdout.strip()
        # By name, every one seen: natrix's stop ends them one by one.
        threads.update((t[0], t) for t in napi_threads())
        switch_threads = switch_threads or napi_threads(SWITCH_NAPI)
        time.sleep(0.2)
    out, err = ended(proc, stdout, stderr)
    assert any(json.loads(line)["test"] == "cpu" for line in out.splitlines() if line.strip())

    want = expected_lab_cpus(1, cpus)
    assert set(masks) == {"nx-nat-in", "nx-nat-out"}, f"the device's peers were never steered: {masks}"
    for dev, mask in masks.items():
        assert rps_mask_cpus(mask) == want, f"{dev}: rps_cpus {mask.strip()}, want CPUs {want}"
    if bridge_keys:
        assert len(filtering) == 2 and all(v == "0" for v in filtering.values()), f"nx-sw filters bridged frames: {filtering}"

    assert {name.split("-")[0] for name in threads} == {"napi/inside", "napi/outside"}, f"not every link's NAPI thread seen: {threads}"
    assert not switch_threads, f"the switch's NAPI was threaded without --switch-napi lab: {switch_threads}"
    assert qdisc_reads and not qdiscs, f"the switch's ports buffered without --port-buffer ({qdisc_reads} reads): {qdiscs}"
    # Where real-time priority is refused (a cgroup without RT time), the
    # tester must say so rather than measure quietly without it.
    refused = "left at its priority, not SCHED_FIFO 50" in err
    for name, cls, rtprio, affinity in threads.values():
        assert (cls, rtprio) == ("FF", "50") or refused, f"{name}: {cls} {rtprio}, and natrix test did not say why:\n{err[-2000:]}"
        assert affinity == {1}, f"{name} runs on {affinity}, natrix's worker on CPU 1"
    assert not lab_up(), "natrix test left its lab behind"


def test_natrix_with_generic_xdp_has_its_receive_work_steered_to_its_cpus(no_lab, tmp_path):
    """README, "Measuring" and "XDP mode": with natrix's XDP programs in
    generic mode (`xdp_mode = "generic"` in the configuration given with
    --config) its links have no NAPI threads, so the tester steers their
    receive work to natrix's CPU with RPS, as it does the kernel's, says
    nothing of threads it has no reason to pin, and still gives natrix's
    working CPU time per frame."""
    cpus = os.cpu_count()
    if cpus < 2:
        pytest.skip("one CPU: nothing is steered")
    config = tmp_path / "generic.toml"
    up = natrix_cli("lab", "up", "--config-out", str(config))
    assert up.returncode == 0, up.stderr
    down = natrix_cli("lab", "down")
    assert down.returncode == 0, down.stderr
    config.write_text('xdp_mode = "generic"\n' + config.read_text())
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
        proc = subprocess.Popen([str(h.natrix_bin()), "test", "--dut", "natrix", "--quick", "--tests", "cpu", "--json",
                                 "--config", str(config), "--out", str(tmp_path / "results")],
                                stdout=out_file, stderr=err_file, text=True, env=h.clean_env())
    masks, shown, threads = {}, {}, []
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        for dev in ("inside", "outside"):
            read = subprocess.run(["ip", "netns", "exec", "nx-nat", "cat", f"/sys/class/net/{dev}/queues/rx-0/rps_cpus"],
                                  capture_output=True, text=True, timeout=10)
            if read.returncode == 0 and int(read.stdout.strip().replace(",", "") or "0", 16):
                masks[dev] = read.stdout
            link = subprocess.run(["ip", "-n", "nx-nat", "-d", "link", "show", dev], capture_output=True, text=True, timeout=10)
            if link.returncode == 0 and "prog/xdp" in link.stdout:
                shown[dev] = link.stdout.split()
        threads += napi_threads()
        time.sleep(0.2)
    out, err = ended(proc, stdout, stderr)
    results = [json.loads(line) for line in out.splitlines() if line.strip()]
    cpu = [r["cpu"] for r in results if r["test"] == "cpu"]
    assert cpu, f"no cpu result: {results}"

    assert set(shown) == {"inside", "outside"}, f"natrix's programs were never seen attached: {shown}"
    for dev, words in shown.items():
        assert "xdpgeneric" in words, f"{dev}: not in generic mode: {' '.join(words)}"
    assert set(masks) == {"inside", "outside"}, f"natrix's links were never steered: {masks}"
    for dev, mask in masks.items():
        assert rps_mask_cpus(mask) == [1], f"{dev}: rps_cpus {mask.strip()}, want natrix's CPU 1"
    assert not threads, f"natrix's links have NAPI threads with generic programs: {threads}"
    assert "no threaded NAPI" not in err and "no NAPI threads" not in err, f"the tester complains of NAPI threads it has no reason to pin:\n{err[-2000:]}"
    assert isinstance(cpu[0].get("dut_work_ns_per_frame"), (int, float)), f"no working CPU per frame for natrix: {cpu[0]}"
    assert not lab_up(), "natrix test left its lab behind"


def test_the_switch_receives_in_napi_threads_on_the_lab_cpus_and_buffers_when_asked(no_lab, tmp_path):
    """README, "Measuring", `--switch-napi lab` and `--port-buffer`: the
    switch's ends of the device's links get threaded NAPI, its threads on
    the lab's CPUs at SCHED_FIFO 50, and a FIFO of the frames asked for
    (the kernel as the device here; the defaults, "sender" and none, are
    checked with natrix above)."""
    cpus = os.cpu_count()
    if cpus < 2:
        pytest.skip("one CPU: the lab has no CPUs apart from the device's")
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
        proc = subprocess.Popen([str(h.natrix_bin()), "test", "--dut", "kernel", "--quick", "--tests", "cpu", "--switch-napi", "lab",
                                 "--port-buffer", "500", "--json", "--out", str(tmp_path / "results")],
                                stdout=out_file, stderr=err_file, text=True, env=h.clean_env())
    threads, qdiscs = [], {}
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        threads = napi_threads(SWITCH_NAPI) or threads
        for dev in ("nx-nat-in", "nx-nat-out"):
            qdiscs[dev] = port_qdiscs(dev) or qdiscs.get(dev, set())
        time.sleep(0.2)
    _, err = ended(proc, stdout, stderr)
    assert {name for name, *_ in threads} == set(SWITCH_NAPI), f"the switch's NAPI threads were not seen: {threads}\n{err[-2000:]}"
    refused = "left at its priority, not SCHED_FIFO 50" in err
    want = set(expected_lab_cpus(1, cpus))
    for name, cls, rtprio, affinity in threads:
        assert (cls, rtprio) == ("FF", "50") or refused, f"{name}: {cls} {rtprio}, and natrix test did not say why:\n{err[-2000:]}"
        assert affinity == want, f"{name} runs on {affinity}, want the lab's CPUs {want}"
    assert qdiscs == {"nx-nat-in": {("root", "pfifo", "500p")}, "nx-nat-out": {("root", "pfifo", "500p")}}, qdiscs
    assert not lab_up(), "natrix test left its lab behind"


def test_a_lab_with_queues_buffers_every_transmit_queue_of_the_switch_ports(no_lab):
    """README, "Lab", `natrix lab up --port-buffer N --queues Q`: each of
    the switch's ends of the device's links gets a FIFO of N frames under
    every one of its Q transmit queues (mq), and none without it."""
    up = natrix_cli("lab", "up", "--queues", "2", "--port-buffer", "300", "--config-out", "/tmp/natrix-port-buffer-test.toml")
    try:
        assert up.returncode == 0, up.stderr
        for dev in ("nx-nat-in", "nx-nat-out"):
            got = port_qdiscs(dev)
            assert got == {("1:1", "pfifo", "300p"), ("1:2", "pfifo", "300p")}, f"{dev}: {got}"
            shown = in_switch("tc", "qdisc", "show", "dev", dev).stdout
            assert re.search(r"qdisc mq 1: root", shown), shown
    finally:
        natrix_cli("lab", "down")
    up = natrix_cli("lab", "up", "--queues", "2", "--config-out", "/tmp/natrix-port-buffer-test.toml")
    try:
        assert up.returncode == 0, up.stderr
        for dev in ("nx-nat-in", "nx-nat-out"):
            assert port_qdiscs(dev) == set(), f"{dev} buffered without --port-buffer"
    finally:
        natrix_cli("lab", "down")


def port_qdiscs(dev):
    """{(parent, kind, limit)} of the FIFOs on nx-sw's end `dev` of a
    device link ("root" for a root qdisc), as tc shows them; None where
    tc could not show them (no lab yet, or no tc)."""
    shown = in_switch("tc", "qdisc", "show", "dev", dev)
    if shown.returncode != 0:
        return None
    found = set()
    for line in shown.stdout.splitlines():
        m = re.match(r"qdisc (pfifo|bfifo) \S+ (root|parent (\S+)).*limit (\S+)", line)
        if m:
            found.add((m.group(3) or "root", m.group(1), m.group(4)))
    return found


def expected_iperf3_cpus(workers, cpus):
    """README, "Measuring": iperf3's server on the last of the lab's own
    CPUs and its client on the one before, where they are not CPU 0; else
    CPU 0, with the tester."""
    own = [c for c in expected_lab_cpus(workers, cpus) if c != 0]
    return {"server": own[-1] if own else 0, "client": own[-2] if len(own) > 1 else 0}


def test_tcp_says_what_each_frame_cost_the_device_and_whether_the_lab_was_the_limit(no_lab, tmp_path):
    """README, "Measuring", `tcp`: beside the throughput, the frames the
    device sent into the lab, its CPUs' busy time per frame and share, the
    busiest other CPU, and `generator_limited` where that CPU was full and
    the device's were not; iperf3's hosts on CPUs of their own where the
    host has them."""
    cpus = os.cpu_count()
    if cpus < 2:
        pytest.skip("one CPU: the device has no CPU of its own to charge")
    stdout = tmp_path / "stdout"
    with open(stdout, "w") as out_file:
        proc = subprocess.Popen([str(h.natrix_bin()), "test", "--dut", "natrix", "--quick", "--tests", "tcp", "--json",
                                 "--out", str(tmp_path / "results")],
                                stdout=out_file, stderr=subprocess.PIPE, text=True, env=h.clean_env())
    seen = {}
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        for role, flag in (("server", "-s"), ("client", "-c")):
            affinity = iperf3_by_port(flag).get("5201")
            if affinity is not None:
                seen[role] = affinity
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    err = proc.communicate()[1]
    assert proc.returncode == 0, f"natrix test failed ({proc.returncode}):\n{err[-3000:]}"
    lines = [json.loads(line) for line in stdout.read_text().splitlines() if line.strip()]
    tcp = [l for l in lines if l["test"] == "tcp_throughput"]
    assert len(tcp) == 1, lines
    line, r = tcp[0], tcp[0]["tcp_throughput"]

    want = expected_iperf3_cpus(1, cpus)
    assert r["iperf3_cpus"] == want
    for role, cpu in want.items():
        if role in seen:
            assert seen[role] == {cpu}, f"iperf3's {role} ran on {seen[role]}, want CPU {cpu}"
    assert "server" in seen, "the iperf3 server was never seen running"

    # Over the `measured_s` that carried the transfer, the device sent at
    # least the data segments (bytes over the MSS, 1448 with timestamps)
    # at iperf3's average rate, which its start pulls down, ACKs beside.
    assert 0 < r["measured_s"] <= r["seconds"] + 0.2, r
    segments_per_s = r["gbps"] * 1e9 / 8 / 1448
    assert r["frames"] / r["measured_s"] >= 0.9 * segments_per_s, (
        f"{r['frames']} frames in {r['measured_s']:.2f} s at {segments_per_s:.0f} data segments a second")
    assert r["dut_ns_per_frame"] > 0
    device = set(range(1, cpus)[:1])
    assert r["lab_busiest_cpu"] not in device and 0 <= r["lab_busiest_cpu"] < cpus
    for share in ("dut_cpu_busy", "dut_cpu_busy_max", "lab_cpu_busy"):
        assert 0 <= r[share] <= 1.05, f"{share} {r[share]}"
    assert r["dut_cpu_busy"] <= r["dut_cpu_busy_max"] + 1e-9, r
    # CPU time per frame is busy time over frames: at most the device's
    # one CPU all along the measured intervals (and /proc/stat's idle
    # time, in 10 ms ticks, rounded at each interval's ends).
    assert r["dut_ns_per_frame"] * r["frames"] <= r["measured_s"] * 1e9 * 1.05, r
    assert line["generator_limited"] == (r["lab_cpu_busy"] >= 0.95 and r["dut_cpu_busy_max"] < 0.90), r
    # Frames lost at the device's edges, each direction at its sender.
    assert set(r["dropped"]) == {"into_device", "out_of_device"}, r
    # What each receive queue of natrix's links took, by veth's XDP
    # counters: one queue each here; the data segments came in inside.
    by_queue = r["frames_by_queue"]
    assert set(by_queue) == {"inside", "outside"} and all(len(q) == 1 for q in by_queue.values()), by_queue
    data_segments = r["gbps"] * 1e9 / 8 * r["seconds"] / 1448
    assert by_queue["inside"][0] >= 0.9 * data_segments and by_queue["outside"][0] > 0, (by_queue, data_segments)
    assert all(isinstance(n, int) for n in r["dropped"].values()), r
    # The threads that did natrix's work: its links' NAPI threads, which
    # run its XDP programs, on its CPU, the inside one busy with the data
    # segments, and its worker; each one's shares of the transfer.
    threads = {t["name"].rsplit("-", 1)[0] if t["name"].startswith("napi/") else t["name"]: t for t in r["threads"]}
    assert {"napi/inside", "napi/outside", "natrix-w0"} <= set(threads), r["threads"]
    for t in r["threads"]:
        assert 0 <= t["busy"] <= 1.05 and (t["waiting"] is None or 0 <= t["waiting"] <= 1.05), t
    assert threads["napi/inside"]["cpu"] in device and threads["napi/inside"]["busy"] > 0, threads
    assert not lab_up(), "natrix test left its lab behind"


def ended(proc, stdout, stderr):
    """The text `proc` wrote to the files `stdout` and `stderr`, once it
    has exited 0 (killed and failed if still running)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    out, err = stdout.read_text(), stderr.read_text()
    assert proc.returncode == 0, f"natrix test failed ({proc.returncode}):\n{err[-3000:]}"
    return out, err


def iperf3_by_port(role):
    """The CPU affinities of the iperf3 clients ("-c") or servers ("-s")
    running now, by the server's port."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, timeout=10).stdout
    found = {}
    for line in ps.splitlines():
        pid, _, args = line.strip().partition(" ")
        words = args.split()
        if words and os.path.basename(words[0]) == "iperf3" and role in words and "-p" in words:
            try:
                found[words[words.index("-p") + 1]] = os.sched_getaffinity(int(pid))
            except OSError:
                continue
    return found


def test_tcp_runs_as_many_transfers_at_once_as_asked(no_lab, tmp_path):
    """README, "Measuring", `--tcp-streams`: two iperf3 transfers at once,
    each to a server of its own, the first pair on the CPUs the single
    transfer gets and the second on the two before them where the host
    has them; the result is their sum, and lists each."""
    cpus = os.cpu_count()
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
        proc = subprocess.Popen([str(h.natrix_bin()), "test", "--dut", "kernel", "--quick", "--tests", "tcp", "--tcp-streams", "2", "--json",
                                 "--out", str(tmp_path / "results")],
                                stdout=out_file, stderr=err_file, text=True, env=h.clean_env())
    together, servers = {}, {}
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        clients = iperf3_by_port("-c")
        if len(clients) > len(together):
            together = clients
        servers.update(iperf3_by_port("-s"))
        time.sleep(0.05)
    out, err = ended(proc, stdout, stderr)
    assert set(together) == {"5201", "5202"}, f"the two clients never ran at once: {together}"
    assert set(servers) == {"5201", "5202"}, f"a server per transfer: {servers}"
    (line,) = [l for l in map(json.loads, out.splitlines()) if l["test"] == "tcp_throughput"]
    r = line["tcp_throughput"]
    assert line["flows"] == 2 and len(r["streams"]) == 2, line
    assert all(s["gbps"] > 0 for s in r["streams"]), r["streams"]
    assert r["streams"][0]["gbps"] != r["streams"][1]["gbps"], f"each transfer's own report: {r['streams']}"
    assert abs(r["gbps"] - sum(s["gbps"] for s in r["streams"])) < 1e-6, r
    assert r["retransmits"] == sum(s["retransmits"] for s in r["streams"]), r
    assert "frames_by_queue" not in r, "the kernel runs no XDP program to count its queues' frames"
    own = [c for c in expected_lab_cpus(1, cpus) if c != 0][::-1]
    want = [{"server_cpu": own[i] if i < len(own) else 0, "client_cpu": own[i + 1] if i + 1 < len(own) else 0} for i in (0, 2)]
    assert [{k: s[k] for k in ("server_cpu", "client_cpu")} for s in r["streams"]] == want, r["streams"]
    assert r["iperf3_cpus"] == {"server": want[0]["server_cpu"], "client": want[0]["client_cpu"]}, r
    for port, stream in zip(("5201", "5202"), want):
        assert together[port] == {stream["client_cpu"]}, f"the client to {port} ran on {together[port]}, want CPU {stream['client_cpu']}"
        assert servers[port] == {stream["server_cpu"]}, f"the server on {port} ran on {servers[port]}, want CPU {stream['server_cpu']}"
    assert not lab_up(), "natrix test left its lab behind"


def test_natrix_test_puts_back_what_it_changed_in_a_lab_it_did_not_build(no_lab, tmp_path):
    """README, "Measuring": in a lab left up by `natrix lab up`, the
    tester changes the switch's receive steering for its run and puts it
    back, and leaves the lab up."""
    up = natrix_cli("lab", "up")
    assert up.returncode == 0, up.stderr
    try:
        before = {dev: in_switch("cat", f"/sys/class/net/{dev}/queues/rx-0/rps_cpus").stdout for dev in ("nx-nat-in", "nx-nat-out")}
        proc = natrix_cli("test", "--dut", "natrix", "--quick", "--tests", "cpu", "--json", "--out", str(tmp_path / "results"), timeout=240)
        assert proc.returncode == 0, f"natrix test failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        assert "not (all) steered" not in proc.stderr, proc.stderr[-2000:]
        assert lab_up(), "natrix test took down a lab it did not build"
        after = {dev: in_switch("cat", f"/sys/class/net/{dev}/queues/rx-0/rps_cpus").stdout for dev in before}
        assert after == before, f"rps_cpus not put back: {before} -> {after}"
    finally:
        down = natrix_cli("lab", "down")
        assert down.returncode == 0, down.stderr


def test_a_lab_left_up_of_one_kind_refuses_a_run_that_needs_both_before_measuring(lab, tmp_path):
    """CONTRACTS, "Tester": `natrix test` uses a lab `natrix lab up` left, as
    it was built, of one kind. A run over both devices is refused at once,
    saying how to go on, rather than after the first device's results."""
    assert lab_up(), "the session's natrix lab is up"
    out = tmp_path / "results"
    started = time.monotonic()
    p = natrix_cli("test", "--dut", "natrix,kernel", "--quick", "--tests", "cpu", "--out", str(out), timeout=60)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "needs the other kind" in p.stderr and "natrix lab down" in p.stderr, p.stderr
    assert not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text().strip(), "nothing measured"
    assert time.monotonic() - started < 30, "refused before any measurement"
    assert lab_up(), "the lab left up stays"
