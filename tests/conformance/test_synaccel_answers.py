"""What ends a SYN accelerator attempt, and what does not (seed 003 sections
4.2 and 3.6.2, CONTRACTS.md "SYN accelerator", RFC 9293 section 3.10.7.3,
RFC 6298, RFC 5927), in replay, judged by scapy.

Written from the seed, the contract and the RFCs, not from natrix's source.
The caller's SYN carries no data, so the only acknowledgment a TCP in
SYN-SENT accepts is ISN+1 (RFC 9293 section 3.10.7.3: SND.UNA = ISS,
SND.NXT = ISS+1, "If SEG.ACK =< ISS or SEG.ACK > SND.NXT ... discard"):

- an answer from the server ends tracking only when the caller would accept
  it: a SYN-ACK acking ISN+1, a RST+ACK acking ISN+1, or a bare SYN (a
  simultaneous open); anything else is forwarded but the copies and the
  reset at the deadline go on;
- an ICMP error quoting the SYN natrix forwarded, ISN included, ends
  tracking when it is one every stack gives up on (protocol or port
  unreachable, administratively prohibited; seed 003 section 1: "host/port
  unreachable ICMP messages ... it aborts the waiting state"); the soft
  errors of RFC 1122 section 4.2.3.9 (net or host unreachable, time
  exceeded) leave the attempt running;
- the caller's own RST ends its attempt only when its sequence number is
  ISN+1 (RFC 9293 section 3.10.7.3: a RST the caller sends rejecting a stale
  SYN-ACK carries seq = that SYN-ACK's ack);
- the caller's own retransmissions are absorbed to the deadline
  (CONTRACTS.md), and check-config warns of a deadline past the schedule;
- a SYN sent as IPv4 fragments is not tracked;
- `interval` under 10 ms is refused;
- with interval = "rtt", a reset at the deadline doubles the next interval
  (up to max(500 ms, 1.5 x learned)), a valid sample (answer to a first SYN
  alone, Karn's rule) undoes the doublings 1.5 x the RFC 6298 smoothed
  time no longer needs to cover 1.5 x that sample.

Every test that says an attempt goes on checks both halves: the copies still
leave on schedule AND the caller gets natrix's reset at the deadline; every
test that says it ends checks that nothing more leaves and no reset comes.
"""

import struct

import pytest
from scapy.utils import checksum

import natrix_harness as h
from natrix_harness import IP, POOL1, SRV1, SUB_A, T0, TCP, in_net, none_of, one, pick
from test_synaccel import ACCEL, ISN, SIP, SYN_OPTIONS, accepted_in_syn_sent, caller_syn, config, ext_of, is_rst

ROUTER = "198.51.100.99"  # a router on the path, outside
DEFAULT_SCHEDULE = [0.0, 0.5, 1.0, 1.5]  # the caller's SYN and 3 copies
DEADLINE = 2.0


def syns(outs, seq=ISN, port=SIP, dst=SRV1):
    """SYNs towards the server (the caller's forwarded SYN and natrix's copies) with this ISN."""
    return pick(outs, "outside", lambda p: h.is_tcp(p) and p[TCP].flags == "S" and p[IP].dst == dst
                and p[TCP].dport == port and p[TCP].seq == seq)


def times(os, t0=T0):
    return [round(o.ts - t0, 6) for o in os]


def natrix_reset(isn=ISN, sport=40000):
    """natrix's RST to the caller (CONTRACTS.md: RST+ACK from the server's
    address and port, seq 0, ack ISN+1, window 0)."""
    return lambda p: (h.is_tcp(p) and p[TCP].flags == "RA" and p[IP].src == SRV1 and p[TCP].sport == SIP
                      and p[TCP].dport == sport and p[TCP].seq == 0 and p[TCP].ack == (isn + 1) % 2**32
                      and p[TCP].window == 0)


def assert_goes_on(outs, isn=ISN, sport=40000, t0=T0, schedule=DEFAULT_SCHEDULE, deadline=DEADLINE):
    """The attempt was not ended: every copy left on schedule and the caller
    got natrix's reset, stamped with the deadline, that it accepts."""
    assert times(syns(outs, isn), t0) == schedule, "copies stopped: the attempt was ended\n" + h.dump(outs)
    rst = one(outs, "inside", natrix_reset(isn, sport), "reset from natrix at the deadline")
    assert abs(rst.ts - (t0 + deadline)) < 1e-6, h.dump(outs)
    assert accepted_in_syn_sent(rst.pkt, isn, (SUB_A, sport), (SRV1, SIP)) == "reset"


def assert_ended(outs, sent, isn=ISN, sport=40000, t0=T0):
    """The attempt ended: only the SYNs due before the end left, no reset came."""
    assert times(syns(outs, isn), t0) == sent, "copies went on after the attempt ended\n" + h.dump(outs)
    none_of(outs, "inside", natrix_reset(isn, sport), "reset from natrix")


def started(replay, cfg=None, isn=ISN, sport=40000):
    """A scenario with the caller's SYN at T0 and the external address and
    port natrix gave it (from a first run)."""
    s = h.Scenario(replay, cfg or config())
    s.add(T0, "inside", caller_syn(sport=sport, seq=isn))
    ext, port = ext_of(s.run()[0])
    return s, ext, port


# ---------------------------------------------------------------------------
# A. Answers from the server
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("flags,ack,what", [
    ("SA", ISN, "SYN-ACK acking the ISN itself (SEG.ACK =< ISS)"),
    ("SA", ISN + 2, "SYN-ACK acking past SND.NXT"),
    ("SA", 1001, "SYN-ACK for another attempt's ISN (1000)"),
    ("R", 0, "RST without ACK (a firewall's)"),
    ("R", ISN + 1, "RST without the ACK bit whose ack field happens to be ISN+1"),
    ("RA", ISN + 2, "RST+ACK with a wrong ack"),
    ("RA", ISN, "RST+ACK acking the ISN itself"),
])
def test_an_answer_the_caller_would_not_accept_leaves_the_attempt_running(replay, flags, ack, what):
    """RFC 9293 section 3.10.7.3: in SYN-SENT, a segment whose ACK is not
    ISN+1 is not acceptable (a SYN-ACK is answered with a reset and
    discarded, a RST+ACK is discarded), and a RST without ACK is dropped.
    Such a frame is not the server's answer to this SYN: natrix forwards
    it to the caller (at its own time) but keeps tracking: copies at 0.5,
    1.0 and 1.5 s and the reset at 2 s."""
    s, ext, port = started(replay)
    seg = h.tcp_in(SRV1, SIP, ext, port, flags, seq=56896001, ack=ack)
    if "A" not in flags:
        seg[TCP].ack = ack  # scapy keeps the field even without the ACK bit
    s.add(T0 + 0.7, "outside", seg)
    outs, report = s.run()
    assert_goes_on(outs)
    fwd = one(outs, "inside", lambda p: h.is_tcp(p) and p[TCP].seq == 56896001, what)
    assert abs(fwd.ts - (T0 + 0.7)) < 1e-6 and str(fwd.pkt[TCP].flags) == flags and fwd.pkt[TCP].ack == ack
    assert (fwd.pkt[IP].dst, fwd.pkt[TCP].dport) == (SUB_A, 40000)
    assert accepted_in_syn_sent(fwd.pkt, ISN, (SUB_A, 40000), (SRV1, SIP)) in ("ignored", "other")
    assert report["syn_accel"]["answered"] == 0 and report["syn_accel"]["resets"] == 1, report["syn_accel"]


@pytest.mark.parametrize("flags", ["SA", "RA"])
def test_an_acceptable_answer_across_the_sequence_wrap_ends_tracking(replay, flags):
    """RFC 9293 section 3.4: sequence numbers are modulo 2**32; with ISN
    2**32-1 the acceptable ACK is 0. A SYN-ACK or RST+ACK acking 0 is the
    answer: nothing leaves after it and no reset comes."""
    isn = 2**32 - 1
    s, ext, port = started(replay, isn=isn)
    s.add(T0 + 0.7, "outside", h.tcp_in(SRV1, SIP, ext, port, flags, seq=56896001, ack=0))
    outs, report = s.run()
    assert_ended(outs, [0.0, 0.5], isn=isn)
    fwd = one(outs, "inside", lambda p: h.is_tcp(p) and p[TCP].seq == 56896001, "the answer")
    assert str(fwd.pkt[TCP].flags) == flags and fwd.pkt[TCP].ack == 0
    assert report["syn_accel"]["resets"] == 0


def test_a_late_syn_ack_for_an_older_attempt_and_the_callers_rst_of_it_leave_the_new_attempt_running(replay):
    """The review's case (seed 003 appendix 7.1.2 ISN): the attempt with ISN
    2835748628 is reset at its deadline; the caller reconnects from the same
    port with ISN 1000; the server's late SYN-ACK for the old attempt
    (ack 2835748629) arrives. The caller, in SYN-SENT with ISS 1000, finds
    the ACK unacceptable and sends <SEQ=SEG.ACK><CTL=RST> (RFC 9293 section
    3.10.7.3). Neither frame answers the new SYN: the SYN-ACK reaches the
    caller, the new attempt's copies go on and the caller gets the new
    attempt's reset (ack 1001) at its deadline."""
    s = h.Scenario(replay, config())
    s.add(T0, "inside", caller_syn(seq=ISN))
    t1 = T0 + 3.5  # past the old attempt's deadline (2 s) and its record's grace (1 s)
    s.add(t1, "inside", caller_syn(seq=1000))
    outs, _ = s.run()
    assert_goes_on(outs, isn=ISN)
    new = syns(outs, 1000)[0].pkt
    ext, port = new[IP].src, new[TCP].sport
    stale = h.tcp_in(SRV1, SIP, ext, port, "SA", seq=56896001, ack=ISN + 1)
    s.add(t1 + 0.2, "outside", stale)
    s.add(t1 + 0.2005, "inside", h.tcp_out(SUB_A, 40000, SRV1, SIP, "R", seq=ISN + 1, ack=0))
    outs, report = s.run()
    sa = one(outs, "inside", lambda p: h.is_tcp(p) and p[TCP].flags == "SA", "the stale SYN-ACK")
    assert abs(sa.ts - (t1 + 0.2)) < 1e-6 and sa.pkt[TCP].ack == ISN + 1
    assert accepted_in_syn_sent(sa.pkt, 1000, (SUB_A, 40000), (SRV1, SIP)) == "ignored"
    assert_goes_on(outs, isn=ISN)  # the old attempt, as before
    assert_goes_on(outs, isn=1000, t0=t1)
    assert report["syn_accel"]["resets"] == 2 and report["syn_accel"]["answered"] == 0, report["syn_accel"]


# ---------------------------------------------------------------------------
# B. Simultaneous open
# ---------------------------------------------------------------------------


def test_a_bare_syn_from_the_server_ends_tracking(replay):
    """RFC 9293 section 3.10.7.3 (SYN-SENT, "fifth, if neither of the SYN or
    RST bits is set ... If the SYN bit is on ... enter SYN-RECEIVED") and
    section 3.5 (simultaneous initiation): a SYN without ACK from the
    server's address and port to the caller's translated address and port
    is the server answering; it reaches the caller (RFC 5382 REQ-2), and
    natrix sends no more copies and no reset."""
    s, ext, port = started(replay)
    s.add(T0 + 0.7, "outside", h.tcp_in(SRV1, SIP, ext, port, "S", seq=777000, ack=0))
    outs, report = s.run()
    assert_ended(outs, [0.0, 0.5])
    syn = one(outs, "inside", lambda p: h.is_tcp(p) and p[TCP].flags == "S", "the server's SYN")
    assert (syn.pkt[IP].src, syn.pkt[TCP].sport, syn.pkt[IP].dst, syn.pkt[TCP].dport, syn.pkt[TCP].seq) == (
        SRV1, SIP, SUB_A, 40000, 777000)
    acc = report["syn_accel"]
    assert (acc["resets"], acc["retransmits"], acc["answered"]) == (0, 1, 1), acc


# ---------------------------------------------------------------------------
# C. ICMP errors about the SYN
# ---------------------------------------------------------------------------


def _icmp_about(outs, src, icmp_type, code, quote_len=28, seq=None):
    """An ICMP error from outside quoting the SYN natrix forwarded (its IP
    header and the first `quote_len` - 20 bytes of TCP, RFC 792; or all of
    it), optionally with another sequence number in the quoted TCP header."""
    sent = syns(outs)[0].pkt
    quote = bytearray(h.ip_bytes(sent))
    if seq is not None:
        struct.pack_into("!I", quote, 24, seq)
        struct.pack_into("!H", quote, 36, 0)  # TCP checksum (quoted in full or not, keep it valid)
        tcp = bytes(quote[20:])
        struct.pack_into("!H", quote, 36, checksum(h._pseudo(bytes(quote[12:16]), bytes(quote[16:20]), 6, len(tcp)) + tcp))
    quote = bytes(quote[:quote_len]) if quote_len else bytes(quote)
    return h.icmp_error(h.eth_out(), src, sent[IP].src, quote, icmp_type, code)


@pytest.mark.parametrize("src,icmp_type,code,quote_len", [
    (SRV1, 3, 3, None),     # port unreachable, whole SYN quoted
    (SRV1, 3, 2, 28),       # protocol unreachable, RFC 792 minimum quote
    (ROUTER, 3, 13, 28),    # communication administratively prohibited (RFC 1812)
])
def test_a_hard_icmp_error_about_the_forwarded_syn_ends_tracking(replay, src, icmp_type, code, quote_len):
    """Seed 003 section 1: on "host/port unreachable ICMP messages" the
    caller "aborts the waiting state"; RFC 1122 section 4.2.3.9 makes
    protocol and port unreachable hard errors a TCP acts on, and every
    stack gives up on an administrative prohibition (RFC 1812). So does
    natrix: such an error whose quoted packet is the SYN as natrix
    forwarded it (translated source address and port, the server, the ISN)
    ends tracking: no copy after it, no reset, counted as answered. The
    error itself reaches the caller translated back (RFC 5508 REQ-3)."""
    s, ext, port = started(replay)
    s.add(T0 + 0.7, "outside", _icmp_about(s.run()[0], src, icmp_type, code, quote_len))
    outs, report = s.run()
    assert_ended(outs, [0.0, 0.5])
    none_of(outs, "inside", is_rst, "reset")
    e = one(outs, "inside", h.is_icmp_error, "the ICMP error, translated back")
    assert abs(e.ts - (T0 + 0.7)) < 1e-6
    t, c, emb = h.icmp_info(e.pkt)
    assert (t, c) == (icmp_type, code)
    assert (e.pkt[IP].src, e.pkt[IP].dst) == (src, SUB_A)
    assert (emb.src, emb.sport, emb.dst, emb.dport) == (SUB_A, 40000, SRV1, SIP)
    assert struct.unpack("!I", emb.l4[4:8])[0] == ISN
    acc = report["syn_accel"]
    assert (acc["resets"], acc["retransmits"], acc["answered"]) == (0, 1, 1), acc


@pytest.mark.parametrize("icmp_type,code", [(3, 0), (3, 1), (3, 5), (11, 0)])
def test_a_soft_icmp_error_leaves_the_attempt_running(replay, icmp_type, code):
    """RFC 1122 section 4.2.3.9 (restated in RFC 9293 section 3.9): network
    and host unreachable, source route failed and time exceeded are soft
    errors a TCP "MUST NOT" abort on; a caller that follows it keeps
    retrying, so natrix keeps its schedule and its reset at the deadline
    (a caller that gave up, as Linux does, has no socket left for the
    reset to reach). The error itself reaches the caller."""
    s, ext, port = started(replay)
    s.add(T0 + 0.7, "outside", _icmp_about(s.run()[0], ROUTER, icmp_type, code, 28))
    outs, report = s.run()
    e = one(outs, "inside", h.is_icmp_error, "the ICMP error, translated back")
    assert h.icmp_info(e.pkt)[:2] == (icmp_type, code) and e.pkt[IP].dst == SUB_A
    assert_goes_on(outs)
    assert report["syn_accel"]["resets"] == 1 and report["syn_accel"]["answered"] == 0, report["syn_accel"]


def test_fragmentation_needed_does_not_end_tracking(replay):
    """RFC 1191 / RFC 1122 section 4.2.3.9: ICMP 3/4 (fragmentation needed) is a
    path MTU signal, not a refusal; a SYN is small and the copies still
    make sense. It reaches the caller, and the attempt goes on: copies on
    schedule, the reset at the deadline."""
    s, ext, port = started(replay)
    s.add(T0 + 0.7, "outside", _icmp_about(s.run()[0], ROUTER, 3, 4, 28))
    outs, report = s.run()
    e = one(outs, "inside", h.is_icmp_error, "the ICMP error, translated back")
    assert h.icmp_info(e.pkt)[:2] == (3, 4) and e.pkt[IP].dst == SUB_A
    assert_goes_on(outs)
    assert report["syn_accel"]["resets"] == 1, report["syn_accel"]


@pytest.mark.parametrize("other_seq", [ISN + 1, 12345])
def test_an_unreachable_quoting_another_sequence_number_does_not_end_tracking(replay, other_seq):
    """RFC 5927 (TCP sequence number checking of ICMP error payloads): an
    ICMP error whose quoted TCP sequence number is not the one in flight is not
    about this SYN (a stale or forged error); the attempt goes on: copies on
    schedule, the reset at the deadline."""
    s, ext, port = started(replay)
    s.add(T0 + 0.7, "outside", _icmp_about(s.run()[0], ROUTER, 3, 1, 28, seq=other_seq))
    outs, report = s.run()
    assert_goes_on(outs)
    assert report["syn_accel"]["resets"] == 1, report["syn_accel"]


# ---------------------------------------------------------------------------
# D. The caller's own RST
# ---------------------------------------------------------------------------


def test_the_callers_rst_with_seq_isn_plus_one_ends_its_attempt(replay):
    """A reset from the caller about this SYN carries seq ISN+1 (RFC 9293
    section 3.5.2: a reset answering a segment that acks ISN+1, as the
    server's SYN-ACK reaching a caller that gave up, takes its seq from that
    ACK; one sent from the connection's state uses SND.NXT = ISN+1): it ends
    the attempt: no more copies, no reset to a caller that has given up."""
    s, ext, port = started(replay)
    s.add(T0 + 0.7, "inside", h.tcp_out(SUB_A, 40000, SRV1, SIP, "R", seq=ISN + 1, ack=0))
    outs, report = s.run()
    assert_ended(outs, [0.0, 0.5])
    assert report["syn_accel"]["resets"] == 0, report["syn_accel"]


@pytest.mark.parametrize("seq", [2835748629 + 5, ISN, 0])
def test_the_callers_rst_with_another_seq_leaves_the_attempt_running(replay, seq):
    """RFC 9293 section 3.10.7.3: a caller in SYN-SENT sends
    <SEQ=SEG.ACK><CTL=RST> to reject an unacceptable SYN-ACK (a stale one
    from an earlier attempt, say); that RST is not the caller giving up on
    its SYN, whose reset would carry ISN+1. The attempt goes on: copies on
    schedule, the reset at the deadline."""
    s, ext, port = started(replay)
    s.add(T0 + 0.7, "inside", h.tcp_out(SUB_A, 40000, SRV1, SIP, "R", seq=seq, ack=0))
    outs, report = s.run()
    assert_goes_on(outs)
    assert report["syn_accel"]["resets"] == 1, report["syn_accel"]


# ---------------------------------------------------------------------------
# E. The caller's retransmissions (CONTRACTS.md: absorbed)
# ---------------------------------------------------------------------------


def test_retransmissions_after_natrixs_last_copy_are_still_absorbed_and_check_config_warns(replay, natrix, tmp_path):
    """CONTRACTS.md: the caller's own retransmissions of a tracked attempt
    are absorbed (seed 003 section 4.2.3: "should be ignored"), also after
    natrix's last copy: with attempts = 2 and a deadline of 30 s, the SYNs
    at 0 and 0.5 s are all the server gets, the caller's at 1, 3 and 7 s are
    dropped as syn_absorbed, and the reset comes at 30 s. Such a deadline,
    past the schedule, is accepted by check-config with a warning that
    names the gap."""
    cfg = config({**ACCEL, "attempts": 2, "interval": "500ms", "deadline": "30s"})
    s, ext, port = started(replay, cfg)
    for t in (1.0, 3.0, 7.0):
        s.add(T0 + t, "inside", caller_syn())
    outs, report = s.run()
    assert_goes_on(outs, schedule=[0.0, 0.5], deadline=30.0)
    assert report["drops"] == {"syn_absorbed": 3}, report["drops"]
    p = tmp_path / "c.toml"
    p.write_text(cfg)
    proc = natrix("check-config", str(p))
    assert proc.returncode == 0 and "syn_accel.deadline" in h.proc_text(proc) and "absorbed" in h.proc_text(proc), h.proc_text(proc)


def test_with_the_defaults_every_retransmission_before_the_deadline_is_absorbed(replay):
    """Defaults (4 attempts at 500 ms, deadline 2 s): natrix's schedule runs
    to the deadline, so the caller's retransmissions at 1.0 s (a copy still
    to come) and at 1.7 s (after natrix's last copy, within the interval
    that copy began) are both absorbed (seed 003 section 4.2.3: the
    repeated SYN "should be ignored"), and the caller gets the reset at 2 s."""
    s, ext, port = started(replay)
    s.add(T0 + 1.0, "inside", caller_syn())
    s.add(T0 + 1.7, "inside", caller_syn())
    outs, report = s.run()
    assert times(syns(outs)) == [0.0, 0.5, 1.0, 1.5], h.dump(outs)
    assert report["drops"] == {"syn_absorbed": 2}, report["drops"]
    rst = one(outs, "inside", natrix_reset(), "reset at the deadline")
    assert abs(rst.ts - (T0 + 2.0)) < 1e-6
    assert report["syn_accel"]["resets"] == 1 and report["syn_accel"]["retransmits"] == 3, report["syn_accel"]


# ---------------------------------------------------------------------------
# F. A fragmented SYN
# ---------------------------------------------------------------------------


def _fragmented_syn(sport, cut, data=b"x" * 40, ipid=0x5151):
    """The caller's SYN (40-byte TCP header with Linux's options, carrying
    `data` as a TCP Fast Open SYN may, RFC 7413) as two IPv4 fragments: the
    first (MF, offset 0) holds the whole TCP header and the first `cut` - 40
    bytes of data, the second (offset `cut`) the rest."""
    d = (IP(src=SUB_A, dst=SRV1, ttl=64, id=ipid)
         / TCP(sport=sport, dport=SIP, flags="S", seq=ISN, window=5840, options=SYN_OPTIONS) / data)
    raw = bytes(d)
    assert len(raw) == 60 + len(data) and cut % 8 == 0 and 40 <= cut < 40 + len(data)
    frags = []
    for body, ff in ((raw[20:20 + cut], 0x2000), (raw[20 + cut:], cut // 8)):
        f = bytearray(raw[:20]) + body
        struct.pack_into("!H", f, 2, len(f))
        struct.pack_into("!H", f, 6, ff)
        struct.pack_into("!H", f, 10, 0)
        struct.pack_into("!H", f, 10, checksum(bytes(f[:20])))
        frags.append(h.raw_in(SUB_A, bytes(f)))
    return frags


@pytest.mark.parametrize("cut", [64, 72])
def test_a_syn_sent_as_fragments_is_not_tracked(replay, cut):
    """A SYN in IPv4 fragments is not tracked (a byte copy of the first
    fragment alone is not the SYN): the fragments are forwarded as NAT
    forwards fragments (CONTRACTS.md: translated, no reassembly; the
    harness checks the reassembled TCP checksum), nothing else goes to the
    server and the caller gets no reset, even past the 2 s deadline."""
    f1, f2 = _fragmented_syn(40000, cut)
    outs, report = replay(config(), [(T0, "inside", f1), (T0 + 0.001, "inside", f2)])
    to_srv = pick(outs, "outside", lambda p: IP in p and p[IP].dst == SRV1)
    assert [(round(o.ts - T0, 6), o.pkt[IP].frag, bool(o.pkt[IP].flags.MF)) for o in to_srv] == [
        (0.0, 0, True), (0.001, cut // 8, False)], "the two fragments and nothing else\n" + h.dump(outs)
    for o in to_srv:
        assert in_net(o.pkt[IP].src, POOL1 + "/32") and o.pkt[IP].ttl == 63
    first = h.ip_bytes(to_srv[0].pkt)
    assert struct.unpack("!I", first[24:28])[0] == ISN and first[33] == 0x02, "the SYN's header, translated"
    none_of(outs, "inside", lambda p: True, "frame to the caller")
    assert report["syn_accel"]["retransmits"] == 0 and report["syn_accel"]["resets"] == 0, report["syn_accel"]
    assert report["drops"] == {}, report["drops"]


# ---------------------------------------------------------------------------
# G. check-config
# ---------------------------------------------------------------------------


def test_check_config_refuses_an_interval_under_10ms(natrix, tmp_path):
    """A fixed interval under 10 ms would send all copies within a LAN's
    round trip and amount to a SYN burst: check-config refuses it, naming
    syn_accel.interval; 10 ms is accepted."""
    p = tmp_path / "c.toml"
    for bad in ("1ms", "9ms"):
        p.write_text(h.make_config() + f'[syn_accel]\ndestinations = ["198.51.100.0/24"]\ninterval = "{bad}"\n')
        proc = natrix("check-config", str(p))
        assert proc.returncode != 0 and "syn_accel.interval" in h.proc_text(proc), (bad, h.proc_text(proc))
    p.write_text(h.make_config() + '[syn_accel]\ndestinations = ["198.51.100.0/24"]\ninterval = "10ms"\n')
    proc = natrix("check-config", str(p))
    assert proc.returncode == 0, h.proc_text(proc)


# ---------------------------------------------------------------------------
# H. interval = "rtt": backoff after a reset, recovery on a valid sample
# ---------------------------------------------------------------------------


def _conn(s, t, sport, isn, answer_at=None, ext_of_first=None):
    """A connection from `sport` with `isn` at `t`; optionally the server's
    SYN-ACK `answer_at` seconds after it (to the mapping natrix gave it)."""
    s.add(t, "inside", caller_syn(sport=sport, seq=isn))
    if answer_at is not None:
        out = syns(s.run()[0], isn)[0].pkt
        s.add(t + answer_at, "outside", h.tcp_in(SRV1, SIP, out[IP].src, out[TCP].sport, "SA", seq=isn ^ 0x5A5A,
                                                 ack=isn + 1))


def _rtt_config():
    return config({**ACCEL, "interval": "rtt"})


def test_rtt_a_reset_doubles_the_next_interval_so_a_slower_path_is_not_locked_out(replay):
    """The review's scenario. First connection answered at 20 ms (first SYN
    alone: a valid sample) -> learned 20 ms, interval 30 ms. The path then
    moves to 150 ms: the next connection's SYNs leave at 0, 30, 60, 90 ms,
    the reset at 120 ms (attempts x interval), and the SYN-ACK at 150 ms
    still reaches the caller (seed 003 section 4.2.4). Without backoff every
    later attempt would be reset before the answer (TCP's own rule, RFC
    6298 section 5.5: back off on expiry); with it the next connection uses
    60 ms: SYNs at 0, 60, 120 ms, and its SYN-ACK at 150 ms (before its
    deadline, 240 ms) ends tracking with no reset."""
    s = h.Scenario(replay, _rtt_config())
    _conn(s, T0, 41000, 100000, answer_at=0.020)
    _conn(s, T0 + 10, 41001, 200000, answer_at=0.150)
    _conn(s, T0 + 20, 41002, 300000, answer_at=0.150)
    outs, report = s.run()
    assert times(syns(outs, 100000)) == [0.0], h.dump(outs)
    none_of(outs, "inside", natrix_reset(100000, 41000), "reset of the first connection")
    assert times(syns(outs, 200000), T0 + 10) == [0.0, 0.03, 0.06, 0.09], h.dump(outs)
    rst = one(outs, "inside", natrix_reset(200000, 41001), "reset of the second connection")
    assert round(rst.ts - T0 - 10, 6) == 0.12
    late = one(outs, "inside", lambda p: h.is_tcp(p) and p[TCP].flags == "SA" and p[TCP].dport == 41001, "late SYN-ACK")
    assert round(late.ts - T0 - 10, 6) == 0.15
    assert times(syns(outs, 300000), T0 + 20) == [0.0, 0.06, 0.12], "interval doubled to 60 ms\n" + h.dump(outs)
    none_of(outs, "inside", natrix_reset(300000, 41002), "reset of the third connection")
    one(outs, "inside", lambda p: h.is_tcp(p) and p[TCP].flags == "SA" and p[TCP].dport == 41002, "its SYN-ACK")
    assert report["syn_accel"]["resets"] == 1, report["syn_accel"]


def test_rtt_a_valid_sample_undoes_the_backoff_as_far_as_it_covers_the_sample(replay):
    """Learned 20 ms (interval 30 ms); an unanswered connection is reset at
    120 ms, so the next uses 60 ms. That one is answered at 52 ms, before
    its first copy (due at 60 ms): a valid sample (Karn's rule), smoothed
    as RFC 6298 section 2.3 with gain 1/8: 20 + (52 - 20)/8 = 24 ms, 1.5 x
    that = 36 ms, which does not cover 1.5 x 52 = 78 ms: the doubling stays
    (72 ms: SYNs at 0, 72, 144, 216 ms, the reset at 288 ms, which doubles
    it again). A further answer at 20 ms (srtt 23.5 ms) is covered by 1.5 x
    the average: the connection after it uses 35.25 ms, not doubled."""
    s = h.Scenario(replay, _rtt_config())
    _conn(s, T0, 42000, 100000, answer_at=0.020)
    _conn(s, T0 + 10, 42001, 200000)
    _conn(s, T0 + 20, 42002, 300000, answer_at=0.052)
    _conn(s, T0 + 30, 42003, 400000)
    _conn(s, T0 + 40, 42004, 500000, answer_at=0.020)
    _conn(s, T0 + 50, 42005, 600000)
    outs, report = s.run()
    assert times(syns(outs, 200000), T0 + 10) == [0.0, 0.03, 0.06, 0.09], h.dump(outs)
    assert round(one(outs, "inside", natrix_reset(200000, 42001)).ts - T0 - 10, 6) == 0.12
    assert times(syns(outs, 300000), T0 + 20) == [0.0], "answered before its first copy (60 ms)\n" + h.dump(outs)
    none_of(outs, "inside", natrix_reset(300000, 42002), "reset of the answered connection")
    assert times(syns(outs, 400000), T0 + 30) == [0.0, 0.072, 0.144, 0.216], h.dump(outs)
    assert round(one(outs, "inside", natrix_reset(400000, 42003)).ts - T0 - 30, 6) == 0.288
    assert times(syns(outs, 600000), T0 + 50) == [0.0, 0.03525, 0.0705, 0.10575], h.dump(outs)
    assert report["syn_accel"]["resets"] == 3, report["syn_accel"]


def test_rtt_backoff_doubles_on_each_reset_up_to_500ms_or_one_and_a_half_learned(replay):
    """Each further reset doubles the interval again, up to the larger of
    500 ms and 1.5 x the learned time: learned 20 ms -> 30, 60, 120, 240,
    480, then 500 and 500 ms (deadline 4 x interval each). For a destination
    learned at 400 ms (interval 600 ms, above 500 ms) a reset does not
    lengthen it: 600 ms again."""
    s = h.Scenario(replay, _rtt_config())
    _conn(s, T0, 43000, 1000, answer_at=0.020)
    expected = [0.03, 0.06, 0.12, 0.24, 0.48, 0.5, 0.5]
    for k in range(len(expected)):
        _conn(s, T0 + 10 * (k + 1), 43001 + k, 2000 + k)
    outs, _ = s.run()
    for k, iv in enumerate(expected):
        t0 = T0 + 10 * (k + 1)
        got = times(syns(outs, 2000 + k), t0)
        assert got == [round(i * iv, 6) for i in range(4)], (k, iv, h.dump(outs))
        rst = one(outs, "inside", natrix_reset(2000 + k, 43001 + k), f"reset of connection {k}")
        assert round(rst.ts - t0, 6) == round(4 * iv, 6), (k, iv)

    s = h.Scenario(replay, _rtt_config())
    _conn(s, T0, 44000, 1000, answer_at=0.400)
    _conn(s, T0 + 10, 44001, 2000)
    _conn(s, T0 + 20, 44002, 3000)
    outs, _ = s.run()
    assert times(syns(outs, 1000)) == [0.0], "answered before the first copy (500 ms)"
    for t0, isn, sport in ((T0 + 10, 2000, 44001), (T0 + 20, 3000, 44002)):
        assert times(syns(outs, isn), t0) == [0.0, 0.6, 1.2, 1.8], h.dump(outs)
        assert round(one(outs, "inside", natrix_reset(isn, sport)).ts - t0, 6) == 2.4
