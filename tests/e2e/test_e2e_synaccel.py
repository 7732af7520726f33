"""The SYN accelerator (seed 003, CONTRACTS.md "SYN accelerator") through
`natrix run`, judged by real stacks: Linux's TCP in the subscriber
namespace, nftables dropping SYNs in a server namespace (an unreachable
application server), and SIPp (Debian's sip-tester) as an IMS caller and
application server over TCP, as seed 003 frames the problem.

- A kernel client connecting to the blackholed server gets ECONNREFUSED
  (its stack accepted natrix's reset), where without the accelerator it
  would wait out its own SYN retries (tcp_syn_retries, about two minutes);
  the server saw `attempts` SYNs, the client's own retransmission absorbed.
- To a live server the client connects normally.
- SIPp's UAC completes a call to a reachable UAS over TCP, and its TCP
  connection to the unreachable one is refused.

No time is asserted: a connect that timed out instead of being refused
fails on its errno.
"""

import shutil
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import e2e_harness as h
from e2e_harness import NS_NAT, NS_SRV1, NS_SRV2, NS_SUB1, SRV1, SRV2, SUB1, AgentError

h.skip_module_if_unavailable()

BLACKHOLED_PORT = 7200
SIP_PORT = 5060
# The contract's defaults: 4 SYNs in all, the reset at 2 s. A client's
# connect waits far longer than that before it would give up by itself.
ATTEMPTS = 4
CONNECT_TIMEOUT = 30.0

ACCEL = {"syn_accel": {"destinations": [f"{SRV1}/32", f"{SRV2}/32"]}}


@pytest.fixture
def blackhole():
    """nftables in nx-srv2 drops TCP to BLACKHOLED_PORT and SIP_PORT on input:
    the server's stack never sees the SYNs (the sniffer, on the packet
    socket, still does)."""
    if shutil.which("nft") is None:
        pytest.fail("needs nft (Debian package nftables)")
    for command in ("add table inet synaccel_test",
                    "add chain inet synaccel_test input { type filter hook input priority 0 ; }",
                    f"add rule inet synaccel_test input tcp dport {{ {BLACKHOLED_PORT}, {SIP_PORT} }} drop"):
        h.run_in(NS_SRV2, "nft", command, check=True)
    yield
    h.run_in(NS_SRV2, "nft", "delete table inet synaccel_test")


def metrics(n):
    """natrix's /metrics as {(name, ((label, value), ...)): value}."""
    proc = h.run_in(NS_NAT, "curl", "-s", "--max-time", "5", f"http://{n.api or h.DEFAULT_API}/metrics")
    assert proc.returncode == 0, proc.stderr
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(proc.stdout) for s in fam.samples}


def refused_at_the_blackholed_server(agent):
    """A kernel client's connect to the blackholed server: it must fail
    with ECONNREFUSED (the accelerator's reset), and the server must have
    seen `ATTEMPTS` SYNs of one connection (natrix's copies, the client's
    own retransmission absorbed). Returns those SYNs."""
    srv = agent(NS_SRV2)
    sniff = srv.call("sniff_start")["server"]
    client = agent(NS_SUB1)
    with pytest.raises(AgentError) as refused:
        client.tcp_connect((SRV2, BLACKHOLED_PORT), timeout=CONNECT_TIMEOUT)
    assert refused.value.errno == "ECONNREFUSED", f"expected the accelerator's reset, got {refused.value}"
    syns = [e for e in srv.events(sniff) if e["proto"] == 6 and e.get("dport") == BLACKHOLED_PORT and e.get("flags", 0) & 0x12 == 0x02]
    assert len(syns) == ATTEMPTS, f"the server should see {ATTEMPTS} SYNs: {syns}"
    assert len({(e["src"], e["sport"]) for e in syns}) == 1, f"one connection's SYNs: {syns}"
    return syns


def test_a_kernel_client_to_a_blackholed_server_is_refused(natrix, agent, blackhole):
    n = natrix(ACCEL)
    syns = refused_at_the_blackholed_server(agent)
    assert h.in_pool(syns[0]["src"], n.pool), f"translated: {syns[0]}"
    m = metrics(n)
    assert m[("natrix_synaccel_syns_total", ())] >= 1 and m[("natrix_synaccel_resets_total", ())] >= 1
    assert m[("natrix_synaccel_retransmits_total", ())] >= ATTEMPTS - 1
    assert m[("natrix_drops_total", (("reason", "syn_absorbed"),))] >= 1, "the client's own retransmission"


def test_in_router_mode_a_blackholed_server_is_refused_and_a_live_one_reached(natrix, agent, blackhole, servers, routed_to_subscribers):
    """CONTRACTS.md: with `[nat] mode = "off"` natrix is a transparent bump
    in the wire: the servers see the subscriber's own address, and the
    accelerator still refuses for an unreachable one."""
    natrix(h.deep_merge(h.ROUTER_MODE, ACCEL))
    syns = refused_at_the_blackholed_server(agent)
    assert syns[0]["src"] == SUB1, f"router mode translates nothing: {syns[0]}"
    _, peer = agent(NS_SUB1).tcp_report((SRV1, h.TCP_REPORT), timeout=CONNECT_TIMEOUT)
    assert peer[0] == SUB1, f"router mode translates nothing: the server saw {peer}"


def test_a_kernel_client_to_a_live_server_connects_normally(natrix, agent, servers):
    n = natrix(ACCEL)
    client = agent(NS_SUB1)
    sid, peer = client.tcp_report((SRV1, h.TCP_REPORT), timeout=CONNECT_TIMEOUT)
    assert h.in_pool(peer[0], n.pool), f"translated as ever: the server saw {peer}"
    client.call("tcp_send", sid=sid, data="still here\n")
    m = metrics(n)
    assert m[("natrix_synaccel_answered_total", ())] >= 1 and m[("natrix_synaccel_resets_total", ())] == 0
    assert m[("natrix_synaccel_handshake_seconds_count", ())] >= 1


@pytest.fixture
def sipp():
    if shutil.which("sipp") is None:
        pytest.fail("needs sipp (Debian package sip-tester)")


def test_sipp_calls_a_reachable_uas_over_tcp(natrix, sipp, tmp_path):
    natrix(ACCEL)
    uas = subprocess.Popen(h.netns_cmd(NS_SRV1, "sipp", "-sn", "uas", "-t", "t1", "-i", SRV1, "-p", str(SIP_PORT), "-m", "1", "-nostdin"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path, env=h.clean_env())
    try:
        _wait_listening(NS_SRV1, SIP_PORT)
        uac = subprocess.run(h.netns_cmd(NS_SUB1, "sipp", "-sn", "uac", "-t", "t1", "-i", SUB1, f"{SRV1}:{SIP_PORT}", "-m", "1", "-timeout", "20s", "-nostdin"),
                             capture_output=True, text=True, timeout=60, cwd=tmp_path, env=h.clean_env())
        # The UAC's exit status 0 is a completed call: INVITE answered 180
        # and 200, ACK, BYE answered 200, all over one TCP connection. (The
        # UAS's own status is no judge: its default scenario ends in a 4 s
        # pause that the UAC's closing of TCP cuts short, counted as failed.)
        assert uac.returncode == 0, f"SIPp UAC did not complete its call:\n{uac.stdout[-3000:]}\n{uac.stderr[-2000:]}"
    finally:
        if uas.poll() is None:
            uas.kill()
            uas.wait()


def test_sipp_to_an_unreachable_uas_is_refused(natrix, sipp, blackhole, tmp_path):
    natrix(ACCEL)
    # -trace_err writes SIPp's errors to uac_PID_errors.log in its working directory.
    uac = subprocess.run(h.netns_cmd(NS_SUB1, "sipp", "-sn", "uac", "-t", "t1", "-i", SUB1, f"{SRV2}:{SIP_PORT}", "-m", "1", "-timeout", "60s", "-nostdin", "-trace_err"),
                         capture_output=True, text=True, timeout=90, cwd=tmp_path, env=h.clean_env())
    out = uac.stdout + uac.stderr + "".join(p.read_text(errors="replace") for p in tmp_path.glob("uac_*_errors.log"))
    assert uac.returncode != 0, f"SIPp reached a blackholed UAS?\n{out[-3000:]}"
    assert "Connection refused" in out, f"SIPp's TCP connection should be refused (the accelerator's reset):\n{out[-3000:]}"


def _wait_listening(ns, port, tries=50):
    for _ in range(tries):
        if f":{port} " in h.run_in(ns, "ss", "-Htln").stdout:
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on TCP {port} in {ns}")
