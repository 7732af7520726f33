"""The SYN accelerator (seed 003 sections 3.6.2 and 4.2, CONTRACTS.md "SYN
accelerator", RFC 9293) in replay, judged by scapy.

Written from the seed, the contract and the RFC, not from natrix's source:
- the caller's first SYN is forwarded at once, byte copies of it (as natrix
  forwarded it, translated) follow at `interval` until `attempts` SYNs have
  gone out, and at `deadline` (from the first SYN) the caller gets a RST
  that a TCP in SYN-SENT accepts (RFC 9293 section 3.10.7.3);
- the caller's own retransmissions are absorbed (drop reason `syn_absorbed`);
- a SYN-ACK or RST from the server ends tracking and passes through;
- the races of seed 003 section 4.2.4 (RST and SYN-ACK crossing, a late
  answer after the deadline) let every frame through;
- the connection is untouched after the handshake;
- the same with `[nat] mode = "off"`; timer-driven frames carry the time
  they fall due.
"""

import natrix_harness as h
from natrix_harness import IP, POOL1, SRV1, SRV2, SUB_A, T0, TCP, Ether, in_net, none_of, one, pick

ISN = 2835748628
SIP = 5060
# Linux's SYN options, so the copies are judged on a realistic frame.
SYN_OPTIONS = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (394712, 0)), ("NOP", None), ("WScale", 5)]

ACCEL = {"destinations": [f"{SRV1}/32:{SIP}"]}


def config(syn_accel=None, nat=None, mode_off=False):
    """The suite's NAPT44 config (or router mode) plus a [syn_accel] section."""
    base = '[nat]\nmode = "off"\n' if mode_off else h.make_config(nat=nat)
    lines = ["[syn_accel]"] + [f"{k} = {h._toml_value(v)}" for k, v in (syn_accel or ACCEL).items()]
    return base + "\n".join(lines) + "\n"


def caller_syn(sport=40000, dport=SIP, seq=ISN, dst=SRV1):
    return (h.eth_in(SUB_A) / IP(src=SUB_A, dst=dst, ttl=64, id=4242)
            / TCP(sport=sport, dport=dport, flags="S", seq=seq, window=5840, options=SYN_OPTIONS))


def is_syn_to(port=SIP, dst=SRV1):
    return lambda p: h.is_tcp(p) and p[TCP].flags == "S" and p[IP].dst == dst and p[TCP].dport == port


def is_rst(p):
    return h.is_tcp(p) and "R" in p[TCP].flags


def accepted_in_syn_sent(seg, iss, local, remote):
    """RFC 9293 section 3.10.7.3, SEGMENT ARRIVES in SYN-SENT, for a caller
    whose SYN (ISS, no data) is SND.UNA = ISS, SND.NXT = ISS + 1: returns
    what the caller does with `seg`: "reset" (RST with an acceptable ACK:
    "error: connection reset", CLOSED), "ignored", or "other"."""
    if (seg[IP].dst, seg[TCP].dport, seg[IP].src, seg[TCP].sport) != (*local, *remote):
        return "ignored"  # not this connection's socket pair
    t = seg[TCP]
    snd_una, snd_nxt = iss, (iss + 1) % 2**32
    if "A" in t.flags:
        # "If SEG.ACK =< ISS or SEG.ACK > SND.NXT, send a reset ... and discard"
        if not (snd_una < t.ack <= snd_nxt):
            return "ignored"
    if "R" in t.flags:
        # "If the ACK was acceptable, then signal to the user 'error:
        # connection reset', drop the segment, enter CLOSED state ...
        # Otherwise (no ACK), drop the segment and return."
        return "reset" if "A" in t.flags else "ignored"
    return "other"


def syns_out(outs, port=SIP):
    return pick(outs, "outside", is_syn_to(port))


def ext_of(outs):
    first = syns_out(outs)[0].pkt
    return first[IP].src, first[TCP].sport


def test_an_unanswered_attempt_gets_its_copies_on_schedule_and_the_caller_a_reset_at_the_deadline(replay):
    """Seed 003 appendix 7.1.2 and CONTRACTS.md defaults (500ms, 4 attempts,
    2s): SYNs leave at 0, 0.5, 1.0 and 1.5 s, byte for byte the SYN natrix
    forwarded; at 2 s the caller gets RST+ACK from the server's address and
    port, seq 0, ack ISN+1, window 0, no options."""
    outs, report = replay(config(), [(T0, "inside", caller_syn())])
    syns = syns_out(outs)
    assert [round(o.ts - T0, 6) for o in syns] == [0.0, 0.5, 1.0, 1.5], h.dump(outs)
    first = syns[0].pkt
    assert in_net(first[IP].src, POOL1 + "/32") and first[IP].ttl == 63, "translated and forwarded"
    for o in syns[1:]:
        assert bytes(o.pkt.original) == bytes(first.original), "a copy is the forwarded SYN, byte for byte"
    rst = one(outs, "inside", is_rst, "reset to the caller")
    assert abs(rst.ts - (T0 + 2.0)) < 1e-6, "stamped with the deadline"
    p = rst.pkt
    assert (p[IP].src, p[TCP].sport, p[IP].dst, p[TCP].dport) == (SRV1, SIP, SUB_A, 40000)
    assert p[TCP].flags == "RA"
    assert (p[TCP].seq, p[TCP].ack, p[TCP].window) == (0, ISN + 1, 0)
    assert p[TCP].options == [] and p[TCP].dataofs == 5 and h.l4_data(p) == b""
    assert (p[Ether].dst, p[Ether].src) == (h.mac_for(SUB_A), h.NAT_IN_MAC), "back to the caller's MAC"
    assert accepted_in_syn_sent(p, ISN, (SUB_A, 40000), (SRV1, SIP)) == "reset"
    assert report["packets"]["generated"] == 4, "3 copies and the reset"
    assert report["syn_accel"] == {"syns": 1, "retransmits": 3, "answered": 0, "resets": 1, "untracked": 0}


def test_the_callers_own_retransmissions_are_absorbed(replay):
    """Seed 003 section 4.2.3: the caller's repeated SYN "should be ignored";
    CONTRACTS.md: same addresses, ports and ISN, counted as syn_absorbed."""
    frames = [(T0, "inside", caller_syn()), (T0 + 1.0, "inside", caller_syn()), (T0 + 1.9, "inside", caller_syn())]
    outs, report = replay(config(), frames)
    assert [round(o.ts - T0, 6) for o in syns_out(outs)] == [0.0, 0.5, 1.0, 1.5], h.dump(outs)
    assert report["drops"] == {"syn_absorbed": 2}
    one(outs, "inside", is_rst, "reset")


def test_a_retransmission_crossing_the_reset_is_absorbed_and_a_new_connect_starts_anew(replay):
    """The caller's stack may send a retransmission (Linux: one a second at
    first) before the reset reaches it: natrix refused that attempt and must
    not forward its SYN to the server as a new connection. A later connect
    with a new ISN is a new attempt: forwarded at once."""
    frames = [(T0, "inside", caller_syn()), (T0 + 2.01, "inside", caller_syn()), (T0 + 2.5, "inside", caller_syn(seq=ISN + 7777))]
    outs, report = replay(config(), frames)
    old = [o for o in syns_out(outs) if o.pkt[TCP].seq == ISN]
    assert [round(o.ts - T0, 6) for o in old] == [0.0, 0.5, 1.0, 1.5], h.dump(outs)
    assert report["drops"] == {"syn_absorbed": 1}, report["drops"]
    new = [o for o in syns_out(outs) if o.pkt[TCP].seq == ISN + 7777]
    assert new and round(new[0].ts - T0, 6) == 2.5, h.dump(outs)


def test_a_syn_ack_ends_tracking_and_passes_through(replay):
    """Seed 003 section 4.2.1: the SYN-ACK cancels the timers and reaches the
    caller; nothing more is sent."""
    s = h.Scenario(replay, config())
    s.add(T0, "inside", caller_syn())
    ext, port = ext_of(s.run()[0])
    s.add(T0 + 0.7, "outside", h.tcp_in(SRV1, SIP, ext, port, "SA", seq=56896001, ack=ISN + 1))
    outs, report = s.run()
    assert [round(o.ts - T0, 6) for o in syns_out(outs)] == [0.0, 0.5], h.dump(outs)
    sa = one(outs, "inside", lambda p: h.is_tcp(p) and p[TCP].flags == "SA", "SYN-ACK")
    assert (sa.pkt[IP].dst, sa.pkt[TCP].dport, sa.pkt[TCP].ack) == (SUB_A, 40000, ISN + 1)
    none_of(outs, "inside", is_rst, "reset")
    assert report["syn_accel"]["answered"] == 1 and report["syn_accel"]["resets"] == 0


def test_a_refusal_from_the_server_ends_tracking_and_passes_through(replay):
    """Seed 003 section 4.2.2: the server's RST cancels the timers and reaches the caller."""
    s = h.Scenario(replay, config())
    s.add(T0, "inside", caller_syn())
    ext, port = ext_of(s.run()[0])
    s.add(T0 + 0.2, "outside", h.tcp_in(SRV1, SIP, ext, port, "RA", seq=0, ack=ISN + 1))
    outs, report = s.run()
    assert [round(o.ts - T0, 6) for o in syns_out(outs)] == [0.0], h.dump(outs)
    rst = one(outs, "inside", is_rst, "the server's reset")
    assert abs(rst.ts - (T0 + 0.2)) < 1e-6 and rst.pkt[IP].ttl == 63, "the server's own, forwarded"
    assert report["syn_accel"]["answered"] == 1 and report["syn_accel"]["resets"] == 0


def test_a_syn_ack_crossing_the_reset_reaches_the_caller_too(replay):
    """Seed 003 section 4.2.4: natrix's RST and the server's SYN-ACK may cross;
    the caller gets both and the first counts: natrix does not stop the late
    SYN-ACK, nor a late RST from the server."""
    s = h.Scenario(replay, config())
    s.add(T0, "inside", caller_syn())
    ext, port = ext_of(s.run()[0])
    s.add(T0 + 2.0005, "outside", h.tcp_in(SRV1, SIP, ext, port, "SA", seq=77, ack=ISN + 1))
    s.add(T0 + 2.001, "outside", h.tcp_in(SRV1, SIP, ext, port, "RA", seq=78, ack=ISN + 1))
    outs, report = s.run()
    to_caller = sorted(pick(outs, "inside", h.is_tcp), key=lambda o: o.ts)
    assert [str(o.pkt[TCP].flags) for o in to_caller] == ["RA", "SA", "RA"], h.dump(outs)
    assert to_caller[0].pkt[TCP].seq == 0 and abs(to_caller[0].ts - (T0 + 2.0)) < 1e-6, "natrix's reset first"
    assert to_caller[1].pkt[TCP].seq == 77 and to_caller[2].pkt[TCP].seq == 78
    assert report["syn_accel"]["resets"] == 1 and report["syn_accel"]["answered"] == 0, "answers after the deadline"


def test_what_fell_due_before_an_answer_is_still_sent(replay):
    """Time is the capture's: a copy due at 0.5 s goes out, stamped 0.5 s,
    when the answer comes at 0.5002 s; nothing due after the answer does."""
    s = h.Scenario(replay, config())
    s.add(T0, "inside", caller_syn())
    ext, port = ext_of(s.run()[0])
    s.add(T0 + 0.5002, "outside", h.tcp_in(SRV1, SIP, ext, port, "SA", seq=5, ack=ISN + 1))
    outs, report = s.run()
    assert [round(o.ts - T0, 6) for o in syns_out(outs)] == [0.0, 0.5], h.dump(outs)
    none_of(outs, "inside", is_rst, "reset")
    assert report["syn_accel"]["answered"] == 1


def test_a_retransmission_crossing_the_syn_ack_passes_and_starts_nothing(replay):
    """The caller's retransmission that crossed the server's SYN-ACK is not a
    new attempt: it is forwarded, and no copy or reset follows."""
    s = h.Scenario(replay, config())
    s.add(T0, "inside", caller_syn())
    ext, port = ext_of(s.run()[0])
    s.add(T0 + 0.3, "outside", h.tcp_in(SRV1, SIP, ext, port, "SA", seq=5, ack=ISN + 1))
    s.add(T0 + 0.3001, "inside", caller_syn())
    outs, report = s.run()
    assert [round(o.ts - T0, 4) for o in syns_out(outs)] == [0.0, 0.3001], h.dump(outs)
    none_of(outs, "inside", is_rst, "reset")
    assert "syn_absorbed" not in report["drops"]


def test_the_connection_is_untouched_after_the_handshake(replay):
    """Seed 003 section 4: the hacker "plays role only in the establishment
    phase": the rest of the connection is translated exactly as without it."""
    def run(cfg):
        s = h.Scenario(replay, cfg)
        s.add(T0, "inside", caller_syn())
        ext, port = ext_of(s.run()[0])
        s.add(T0 + 0.1, "outside", h.tcp_in(SRV1, SIP, ext, port, "SA", seq=5000, ack=ISN + 1))
        s.add(T0 + 0.2, "inside", h.tcp_out(SUB_A, 40000, SRV1, SIP, "A", seq=ISN + 1, ack=5001))
        s.add(T0 + 0.3, "inside", h.tcp_out(SUB_A, 40000, SRV1, SIP, "PA", seq=ISN + 1, ack=5001, payload=b"INVITE sip:x SIP/2.0\r\n\r\n"))
        s.add(T0 + 0.4, "outside", h.tcp_in(SRV1, SIP, ext, port, "PA", seq=5001, ack=ISN + 26, payload=b"SIP/2.0 100 Trying\r\n\r\n"))
        s.add(T0 + 5.0, "inside", h.tcp_out(SUB_A, 40000, SRV1, SIP, "FA", seq=ISN + 26, ack=5024))
        s.add(T0 + 5.1, "outside", h.tcp_in(SRV1, SIP, ext, port, "RA", seq=5024, ack=ISN + 27))
        return s.run()[0]
    with_accel = run(config())
    without = run(h.make_config())
    assert [(o.ts, o.side, bytes(o.pkt.original)) for o in with_accel] == [(o.ts, o.side, bytes(o.pkt.original)) for o in without]


def test_other_destinations_and_ports_are_not_accelerated(replay):
    frames = [(T0, "inside", caller_syn(dport=5061)), (T0, "inside", caller_syn(sport=40001, dst=SRV2))]
    outs, report = replay(config(), frames)
    assert len(pick(outs, "outside", h.is_tcp)) == 2 and not pick(outs, "inside"), h.dump(outs)
    assert report["syn_accel"]["syns"] == 0


def test_router_mode_accelerates_the_untranslated_syn(replay):
    """CONTRACTS.md: with [nat] mode = "off" as a transparent bump in the wire."""
    outs, report = replay(config(mode_off=True), [(T0, "inside", caller_syn()), (T0 + 1.0, "inside", caller_syn())])
    syns = syns_out(outs)
    assert [round(o.ts - T0, 6) for o in syns] == [0.0, 0.5, 1.0, 1.5], h.dump(outs)
    assert syns[0].pkt[IP].src == SUB_A and syns[0].pkt[TCP].sport == 40000 and syns[0].pkt[IP].ttl == 63
    assert all(bytes(o.pkt.original) == bytes(syns[0].pkt.original) for o in syns)
    rst = one(outs, "inside", is_rst, "reset").pkt
    assert accepted_in_syn_sent(rst, ISN, (SUB_A, 40000), (SRV1, SIP)) == "reset"
    assert report["drops"] == {"syn_absorbed": 1}


def test_the_schedule_follows_interval_attempts_and_deadline(replay):
    """Seed 003 section 3.6.2's example: SYNs at 0, 750 ms and 1.5 s, the
    reset at 2.25 s; with one attempt, only the reset."""
    cfg = config({**ACCEL, "interval": "750ms", "attempts": 3, "deadline": "2250ms"})
    outs, _ = replay(cfg, [(T0, "inside", caller_syn())])
    assert [round(o.ts - T0, 6) for o in syns_out(outs)] == [0.0, 0.75, 1.5]
    assert abs(one(outs, "inside", is_rst).ts - (T0 + 2.25)) < 1e-6
    outs, _ = replay(config({**ACCEL, "attempts": 1, "deadline": "1s"}), [(T0, "inside", caller_syn())])
    assert [round(o.ts - T0, 6) for o in syns_out(outs)] == [0.0]
    assert abs(one(outs, "inside", is_rst).ts - (T0 + 1.0)) < 1e-6


def test_with_rtt_the_interval_is_one_and_a_half_learned_handshakes(replay):
    """Seed 003 section 3.6.2: "uniform 1.5 RTT intervals"; the default
    deadline is then attempts x interval (CONTRACTS.md)."""
    s = h.Scenario(replay, config({**ACCEL, "interval": "rtt"}))
    s.add(T0, "inside", caller_syn())
    ext, port = ext_of(s.run()[0])
    s.add(T0 + 0.2, "outside", h.tcp_in(SRV1, SIP, ext, port, "SA", seq=1, ack=ISN + 1))
    s.add(T0 + 10.0, "inside", caller_syn(sport=40002, seq=7))
    outs, _ = s.run()
    later = [round(o.ts - T0 - 10.0, 6) for o in syns_out(outs) if o.pkt[TCP].seq == 7]
    assert later == [0.0, 0.3, 0.6, 0.9], h.dump(outs)
    rst = one(outs, "inside", is_rst)
    assert abs(rst.ts - (T0 + 11.2)) < 1e-6 and rst.pkt[TCP].ack == 8


def test_a_new_isn_on_the_same_endpoints_is_a_new_attempt(replay):
    """Only a retransmission (same ISN) is absorbed; a new SYN from the same
    endpoints replaces the attempt, and only its reset is sent."""
    outs, report = replay(config(), [(T0, "inside", caller_syn()), (T0 + 0.25, "inside", caller_syn(seq=99))])
    assert [(round(o.ts - T0, 6), o.pkt[TCP].seq) for o in syns_out(outs)] == [
        (0.0, ISN), (0.25, 99), (0.75, 99), (1.25, 99), (1.75, 99)], h.dump(outs)
    rst = one(outs, "inside", is_rst)
    assert rst.pkt[TCP].ack == 100 and abs(rst.ts - (T0 + 2.25)) < 1e-6
    assert "syn_absorbed" not in report["drops"]


def test_replay_is_deterministic(replay_files):
    frames = [(T0, "inside", caller_syn()), (T0 + 1.0, "inside", caller_syn())]
    a, da = replay_files(config(), frames)
    b, db = replay_files(config(), frames)
    assert a.returncode == 0 and b.returncode == 0
    assert (da / "out.pcapng").read_bytes() == (db / "out.pcapng").read_bytes()


def test_check_config_names_bad_syn_accel_keys(natrix, tmp_path):
    for body, key in [
        ('destinations = ["198.51.100.1/24"]\n', "syn_accel.destinations[0]"),
        ('destinations = ["198.51.100.0/24"]\ninterval = "soon"\n', "syn_accel.interval"),
        ('destinations = ["198.51.100.0/24"]\nattempts = 0\n', "syn_accel.attempts"),
        ('destinations = ["198.51.100.0/24"]\ndeadline = "0s"\n', "syn_accel.deadline"),
    ]:
        p = tmp_path / "c.toml"
        p.write_text(h.make_config() + "[syn_accel]\n" + body)
        proc = natrix("check-config", str(p))
        assert proc.returncode != 0 and key in h.proc_text(proc), h.proc_text(proc)
    p.write_text('[nat]\nmode = "off"\n[syn_accel]\ndestinations = ["198.51.100.0/24:5060-5061"]\ninterval = "rtt"\n')
    assert natrix("check-config", str(p)).returncode == 0


def test_check_config_says_how_much_the_attempts_may_take_under_load(natrix, tmp_path):
    """Each attempt is a record of about 200 bytes, and one answered or
    reset keeps it until its timer fires, so a SYN flood can have records
    for twice `max_sessions` attempts: check-config says how much that is
    beside what is reserved up front."""
    p = tmp_path / "c.toml"
    for sessions in (65536, 262144):
        p.write_text(h.make_config(nat={"max_sessions": sessions}) + '[syn_accel]\ndestinations = ["198.51.100.0/24:5060"]\n')
        proc = natrix("check-config", str(p))
        assert proc.returncode == 0, h.proc_text(proc)
        out = h.proc_text(proc)
        line = next((l for l in out.splitlines() if "more under load" in l), None)
        assert line, out
        grown = int(line.split("(")[1].split(" bytes")[0])
        assert 2 * sessions * 192 <= grown <= 2 * sessions * 256, line
    p.write_text('[nat]\nmode = "off"\n[syn_accel]\ndestinations = ["198.51.100.0/24:5060"]\n')
    assert "more under load" in h.proc_text(natrix("check-config", str(p))), "router mode, where the accelerator is a bump in the wire, too"
    p.write_text(h.make_config(nat={"max_sessions": 65536}))
    assert "more under load" not in h.proc_text(natrix("check-config", str(p))), "nothing grows without the accelerator"
