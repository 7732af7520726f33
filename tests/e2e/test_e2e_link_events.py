"""What natrix does when a link it serves goes down, comes back, or is
deleted under it.

- Down and up again (the lab's inside, in every arrangement): natrix says
  so each time, sleeps while the link is down, and forwards again once it
  is up. An AF_PACKET socket holds ENETDOWN while its link is down, and
  poll reports it at once every time until it is read: unread, it kept
  an idle natrix at 100% of a CPU for as long as the link stayed down.
- Its MTU changed while natrix runs: said, with the MTU natrix goes on
  using (the one it read at start), and the way back too.
- Its next hop moved to another MAC with a gratuitous ARP (a router
  failover): followed at once, also by the flows the XDP program forwards.
- Deleted (natrix on veths in a namespace of its own, so the lab stays
  whole): its sockets went with the interface, so natrix says so and
  stops with status 1, for its service manager to start it anew once the
  interface is back.

About 35 s.
"""

import json
import os
import subprocess
import sys
import time

import pytest

import e2e_harness as h
from e2e_harness import NS_NAT, NS_SRV1, NS_SUB1, NS_SUB2, SRV1

h.skip_module_if_unavailable()

NS_OWN = "nx-linkdel"


def cpu_seconds(pid):
    """User and system time the process has used."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def said(n, text, timeout=5.0):
    """Waits until natrix's stderr holds `text`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in n.err.text():
            return True
        time.sleep(0.1)
    return False


def pings(count=3):
    return h.run_in(NS_SUB1, "ping", "-c", str(count), "-i", "0.3", "-W", "2", SRV1, timeout=20)


# The arrangement's I/O, and AF_PACKET's always: its sockets are the ones
# that hold an error while the link is down.
@pytest.mark.parametrize("io", [None, "af_packet"], ids=["arranged", "af_packet"])
def test_a_link_down_and_up_again_is_said_slept_through_and_forwarded_after(natrix, io):
    n = natrix({"io": io} if io else {})
    assert pings().returncode == 0, f"no echo through natrix before the link went down\n{n.output()}"
    try:
        h.sh("ip", "link", "set", "inside", "down", ns=NS_NAT)
        assert said(n, "inside: link down"), f"natrix should say its inside's link went down\n{n.output()}"
        before = cpu_seconds(n.proc.pid)
        time.sleep(2)
        spent = cpu_seconds(n.proc.pid) - before
    finally:
        h.sh("ip", "link", "set", "inside", "up", ns=NS_NAT)
    # Spinning costs the whole 2 s; sleeping, next to nothing.
    assert spent < 0.5, f"natrix used {spent:.2f} s of CPU in 2 s with its inside down: it should sleep\n{n.output()}"
    assert said(n, "inside: link up again"), f"natrix should say its inside's link is up again\n{n.output()}"
    assert pings(5).returncode == 0, f"no echo through natrix after the link came back\n{n.output()}"


def test_an_mtu_changed_under_natrix_is_said(natrix):
    """natrix reads its interfaces' MTUs once, at start: a change while it
    runs is said, with what natrix goes on using, and so is the way back."""
    n = natrix()
    mtu = h.sh("ip", "-o", "link", "show", "inside", ns=NS_NAT).stdout.split(" mtu ")[1].split()[0]
    try:
        h.sh("ip", "link", "set", "inside", "mtu", "1400", ns=NS_NAT)
        assert said(n, "inside: MTU now 1400; natrix goes on with the " + mtu), f"natrix should say the MTU changed\n{n.output()}"
    finally:
        h.sh("ip", "link", "set", "inside", "mtu", mtu, ns=NS_NAT)
    assert said(n, f"inside: MTU back to {mtu}"), f"natrix should say the MTU is back\n{n.output()}"
    time.sleep(2.5)
    assert n.err.text().count("inside: MTU now 1400") == 1, f"said once, not every second\n{n.output()}"


# Echoes (a home): 100-byte UDP datagrams to the server, 100 a second for
# 8 s, each waited for 10 ms. Prints {"sent", "lost"}.
ECHO_CLIENT = r"""
import json, socket, sys, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(0.002); u.connect((sys.argv[1], int(sys.argv[2])))
got, sent, t0 = set(), 0, time.time()
while time.time() - t0 < 8:
    u.send(str(sent).encode().ljust(100)); sent += 1
    end = time.time() + 0.01
    while time.time() < end:
        try:
            got.add(int(u.recv(200)))
        except (socket.timeout, ValueError):
            pass
print(json.dumps({"sent": sent, "lost": sum(1 for i in range(sent) if i not in got)}), flush=True)
"""

ECHO_SERVER = r"""
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    d, a = u.recvfrom(2000); u.sendto(d, a)
"""

# The server's router fails over (nx-srv1): once told (a line on stdin),
# its MAC changes and it says so with a gratuitous ARP (a request for its
# own address), everything made ready first so that a few ms pass between.
FAILOVER = r"""
import socket, subprocess, sys
from scapy.all import ARP, Ether
mac, ip = sys.argv[1], sys.argv[2]
garp = bytes(Ether(src=mac, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=mac, psrc=ip, hwdst="00:00:00:00:00:00", pdst=ip))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(("eth0", 0))
print("ready", flush=True)
sys.stdin.readline()
subprocess.run(["ip", "link", "set", "eth0", "address", mac], check=True)
s.send(garp)
print("moved", flush=True)
"""


def api_stats():
    r = h.run_in(NS_NAT, "curl", "-sS", "-f", "--noproxy", "*", "-m", "5", f"http://{h.DEFAULT_API}/api/stats", timeout=10)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def fail_over(mac):
    """Moves the server to `mac` with a gratuitous ARP."""
    p = subprocess.Popen(h.netns_cmd(NS_SRV1, sys.executable, "-u", "-c", FAILOVER, mac, SRV1), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=h.clean_env())
    assert p.stdout.readline().strip() == "ready", "the failover helper did not start"
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "moved"
    assert p.wait(timeout=10) == 0


# Two homes: with two workers, each subscriber's flows are another worker's
# (100.64.0.2 and 100.64.0.3 hash apart), and only one of them receives
# the ARP.
@pytest.mark.parametrize("home", [NS_SUB1, NS_SUB2])
def test_a_next_hop_that_moves_with_a_gratuitous_arp_is_followed_at_once(natrix, home):
    """A router failover moves the next hop's MAC and says so with a
    gratuitous ARP. natrix follows at once, also for the flows its XDP
    program forwards by itself, which go on being forwarded there (they
    carry the next hop's address, and before, kept the old one until the
    next sweep, up to a second later)."""
    n = natrix()
    port = 7402
    old_mac = h.sh("cat", "/sys/class/net/eth0/address", ns=NS_SRV1).stdout.strip()
    server = subprocess.Popen(h.netns_cmd(NS_SRV1, sys.executable, "-u", "-c", ECHO_SERVER, str(port)), stdout=subprocess.PIPE, text=True, env=h.clean_env())
    try:
        assert server.stdout.readline().strip() == "ready"
        client = subprocess.Popen(h.netns_cmd(home, sys.executable, "-c", ECHO_CLIENT, SRV1, str(port)), stdout=subprocess.PIPE, text=True, env=h.clean_env())
        time.sleep(3)
        before = api_stats()["offloaded"]
        fail_over("02:aa:bb:cc:dd:ee")
        assert client.poll() is None, "the echoes ended before the move: it would prove nothing"
        time.sleep(2)
        after = api_stats()["offloaded"]
        out, _ = client.communicate(timeout=30)
    finally:
        server.kill()
        server.wait(timeout=5)
        fail_over(old_mac)
    result = json.loads(out)
    assert result["sent"] > 500, result
    if before["egress"]["outside"]:
        assert before["to_outside"] > 0, f"the XDP program should forward the flow by itself by now: {before}"
        assert after["to_outside"] - before["to_outside"] > 100, f"and go on forwarding it to the moved next hop: {before} -> {after}"
    # Each datagram waits 10 ms: the few the change itself catches, no more.
    assert result["lost"] <= 5, f"echoes lost after the next hop moved: {result}\n{n.output()}"


@pytest.fixture
def own_namespace():
    """A namespace with natrix's inside and outside as veths whose peers
    are in it too."""
    h.sh("ip", "netns", "add", NS_OWN)
    try:
        for side in ("inside", "outside"):
            h.sh("ip", "link", "add", side, "type", "veth", "peer", "name", f"{side}-peer", ns=NS_OWN)
            for dev in (side, f"{side}-peer"):
                h.sh("ip", "link", "set", dev, "up", ns=NS_OWN)
        yield NS_OWN
    finally:
        h.sh("ip", "netns", "del", NS_OWN, check=False)


def test_an_interface_deleted_under_natrix_stops_it_with_status_1(lab, own_namespace, tmp_path):
    config = {k: v for k, v in lab.items() if k != "management"}
    n = h.Natrix(config, tmp_path / "natrix.toml", ns=own_namespace)
    try:
        n.wait_ready()
        h.sh("ip", "link", "del", "inside", ns=own_namespace)
        rc = n.proc.wait(timeout=15)
    finally:
        n.stop()
    assert rc == 1, f"natrix should stop with status 1 once its inside is deleted, not {rc}\n{n.output()}"
    assert "inside (index" in n.err.text() and "was deleted" in n.err.text(), f"natrix should say its inside was deleted\n{n.output()}"
