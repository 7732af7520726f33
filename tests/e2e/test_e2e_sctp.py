"""SCTP through a live natrix, judged by a real SCTP stack: Debian's
libusrsctp-examples (usrsctp over raw IPv4, protocol 132; the kernel here
has no SCTP, so raw sockets see SCTP) as the client in both subscribers and
the echo server in nx-srv1, and tshark on the outside to check what left.

Seed 001 and CONTRACTS "SCTP NAT": two subscribers using the same local port
reach the same server through one external address, told apart by their
verification tags; addresses are translated, ports never, and the CRC32c
stays valid without being recomputed; an association ends with its
SHUTDOWN-COMPLETE and is removed.
"""

import json
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import e2e_harness as h
from e2e_harness import NS_SRV1, NS_SRV2, NS_SUB1, NS_SUB2, SRV1, SRV2, SUB1, SUB2

h.skip_module_if_unavailable()

USRSCTP = Path("/usr/lib/usrsctp")
ECHO_PORT = 7  # usrsctp's echo_server listens on the echo port
CLIENT_PORT = 5000
EXTERNAL = "203.0.113.1"
WAIT = 15.0


def need_tools():
    missing = [p for p in (USRSCTP / "client", USRSCTP / "echo_server") if not p.exists()]
    if missing or shutil.which("tshark") is None:
        pytest.fail("SCTP e2e needs Debian's libusrsctp-examples and tshark "
                    "(apt-get install -y libusrsctp-examples tshark)", pytrace=False)


class Lines:
    """A child's stdout, read line by line without blocking forever."""

    def __init__(self, proc):
        self.proc = proc
        self.seen = []

    def wait_for(self, text, timeout=WAIT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.seen):
                return True
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    return any(text in line for line in self.seen)
                self.seen.append(line.rstrip("\n"))
        return False


def spawn(ns, *argv):
    return subprocess.Popen(h.netns_cmd(ns, *argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1, env=h.clean_env())


def stop(proc, sig=signal.SIGTERM):
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def echo_servers(lab):
    """usrsctp's echo_server in nx-srv1 and nx-srv2."""
    need_tools()
    procs = [spawn(ns, USRSCTP / "echo_server") for ns in (NS_SRV1, NS_SRV2)]
    time.sleep(0.5)  # usrsctp opens its raw sockets at start; nothing to wait on
    for p in procs:
        assert p.poll() is None, f"echo_server exited: {p.stderr.read()}"
    yield procs
    for p in procs:
        stop(p, signal.SIGKILL)


@pytest.fixture
def outside_capture(lab, tmp_path):
    """tshark on the servers' link (nx-srv1's eth0 on the outside bridge sees
    what natrix sends to nx-srv1): what natrix sent outside, as a server got it."""
    need_tools()
    pcap = tmp_path / "outside.pcapng"
    proc = spawn(NS_SRV1, "tshark", "-i", "eth0", "-f", "ip proto 132", "-w", str(pcap), "-q")
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.2)
        if ready and "Capturing on" in proc.stderr.readline():
            break
    else:
        stop(proc)
        pytest.fail("tshark in nx-srv1 did not start capturing", pytrace=False)
    yield proc, pcap
    stop(proc, signal.SIGINT)


def read_capture(pcap):
    """(source, destination, source port, destination port, tag, chunk types,
    CRC32c status) of each SCTP packet, by tshark."""
    r = subprocess.run(["tshark", "-r", str(pcap), "-o", "sctp.checksum:CRC-32C", "-T", "fields", "-E", "separator=;",
                        "-e", "ip.src", "-e", "ip.dst", "-e", "sctp.srcport", "-e", "sctp.dstport", "-e", "sctp.verification_tag",
                        "-e", "sctp.chunk_type", "-e", "sctp.checksum.status", "-Y", "sctp"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.split(";") for line in r.stdout.splitlines() if line]


def client(ns, server):
    """usrsctp's client bound to CLIENT_PORT, over raw IPv4 (encapsulation port 0: no UDP)."""
    proc = spawn(ns, USRSCTP / "client", server, str(ECHO_PORT), str(CLIENT_PORT), "0")
    return proc, Lines(proc)


def say(proc, lines, text):
    proc.stdin.write(text + "\n")
    proc.stdin.flush()
    assert lines.wait_for(text), f"no echo of {text!r}: {lines.seen} {proc.stderr.read() if proc.poll() is not None else ''}"


def finish(proc, lines):
    """EOF on stdin: the client shuts its association down (SHUTDOWN,
    SHUTDOWN-ACK, SHUTDOWN-COMPLETE) and reports."""
    proc.stdin.close()
    assert lines.wait_for("Number of packets"), f"the client did not finish its shutdown: {lines.seen}"
    proc.wait(timeout=WAIT)


def wait_until_no_association(n):
    deadline = time.monotonic() + WAIT
    while True:
        stats = json.loads(n.cli("show", "stats", "--json").stdout)
        if stats["sessions"]["sctp"] == 0 or time.monotonic() > deadline:
            return stats


def association_records(log, count):
    """The SCTP records of the JSON event log once `count` deletions are in
    (the logger writes off the packet path)."""
    deadline = time.monotonic() + WAIT
    while True:
        records = [json.loads(line) for line in log.read_text().splitlines() if '"sctp"' in line] if log.exists() else []
        if len([r for r in records if r["event"] == "mapping_delete"]) >= count or time.monotonic() > deadline:
            return records


def check_outside(packets, servers):
    """What left natrix: from the one external address, the subscribers'
    own port, no inside address, every CRC32c valid as sent."""
    from_nat = [p for p in packets if p[0] == EXTERNAL]
    assert {p[1] for p in from_nat} == set(servers), f"SCTP from {EXTERNAL} to {servers}: {packets}"
    assert not [p for p in packets if {p[0], p[1]} & {SUB1, SUB2}], "an inside address leaked outside"
    assert {p[2] for p in from_nat} == {str(CLIENT_PORT)}, "the subscribers' port, untranslated"
    assert all(p[6] == "1" for p in packets), f"tshark finds a bad CRC32c: {[p for p in packets if p[6] != '1']}"
    return from_nat


@pytest.mark.parametrize("workers", [1, 2])
def test_two_subscribers_reach_one_server_from_one_port_through_one_address(natrix, echo_servers, outside_capture, tmp_path, workers):
    """Each subscriber's usrsctp client opens an association to nx-srv1's
    echo server from local port 5000, echoes data both ways and shuts it down;
    the server sees both from the same external address and port. They take
    turns: an SCTP endpoint without draft-ietf-tsvwg-natsupp's Disable Restart
    takes a second association from an address and port it has one with for
    a restart of the first (RFC 9260 section 5.2.2); the replay tests show
    natrix keeping such associations apart by tag at once."""
    log = tmp_path / "events.jsonl"
    n = natrix({"workers": workers, "nat": {"pool": [f"{EXTERNAL}/32"]}, "logging": {"json": str(log)}})
    tshark, pcap = outside_capture
    for ns in (NS_SUB1, NS_SUB2):
        c, lines = client(ns, SRV1)
        try:
            say(c, lines, f"hello from {ns}")
            say(c, lines, f"{ns} again")
            shown = n.cli("show", "sessions", "--json").stdout
            assert '"sctp"' in shown, f"the association in `natrix show sessions`: {shown[:2000]}"
            finish(c, lines)
        finally:
            stop(c, signal.SIGKILL)
    stats = wait_until_no_association(n)
    assert (stats["sessions"]["sctp"], stats["mappings"]["sctp"]) == (0, 0), f"associations left: {stats['sessions']}"
    stop(tshark, signal.SIGINT)

    from_nat = check_outside(read_capture(pcap), [SRV1])
    assert len([p for p in from_nat if p[5].split(",")[0] == "1"]) == 2, f"two INITs: {from_nat}"
    assert len([p for p in from_nat if "14" in p[5].split(",")]) == 2, f"two SHUTDOWN-COMPLETEs: {from_nat}"
    records = association_records(log, 2)
    assert sorted(r["subscriber"] for r in records if r["event"] == "mapping_create") == [SUB1, SUB2], records
    assert sorted(r["subscriber"] for r in records if r["event"] == "mapping_delete") == [SUB1, SUB2], records
    assert all((r["external"], r["external_port"], r["subscriber_port"]) == (EXTERNAL, CLIENT_PORT, CLIENT_PORT) for r in records)


def test_concurrent_associations_share_the_external_address_and_port(natrix, echo_servers, outside_capture):
    """Both subscribers at once, from port 5000 through one external address,
    to two servers on one port, with two workers: inbound SCTP is steered by
    tag to the worker that opened each association."""
    n = natrix({"workers": 2, "nat": {"pool": [f"{EXTERNAL}/32"]}})
    tshark, pcap = outside_capture
    (c1, l1), (c2, l2) = client(NS_SUB1, SRV1), client(NS_SUB2, SRV2)
    try:
        say(c1, l1, "sub1 to srv1")
        say(c2, l2, "sub2 to srv2")
        say(c1, l1, "sub1 while sub2 is up")
        say(c2, l2, "sub2 while sub1 is up")
        stats = json.loads(n.cli("show", "stats", "--json").stdout)
        assert stats["sessions"]["sctp"] == 2, stats["sessions"]
        for c, lines in ((c1, l1), (c2, l2)):
            finish(c, lines)
    finally:
        for c in (c1, c2):
            stop(c, signal.SIGKILL)
    assert wait_until_no_association(n)["sessions"]["sctp"] == 0
    stop(tshark, signal.SIGINT)
    check_outside([p for p in read_capture(pcap) if SRV1 in (p[0], p[1])], [SRV1])
