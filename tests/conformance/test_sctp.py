"""SCTP NAT (seed 001, draft-ietf-tsvwg-natsupp, RFC 9260; CONTRACTS "SCTP
NAT"), judged by scapy's SCTP layers.

Associations are keyed by verification tags and ports: the tag the internal
host chose (its INIT's Initiate Tag, carried by every packet towards it) and
the remote's (the INIT-ACK's Initiate Tag). Addresses are translated, ports
never, and the CRC32c is left as it is. Collisions are answered with an ABORT
with the M bit (0x02) and cause "VTag and Port Number Collision" (0x00B0);
packets matching no association with an ERROR with the M and T bits and
cause "Missing State" (0x00B1) where `reply_ootb` says. Every expectation
below comes from those documents, never from natrix's code.
"""

import json
import struct
import subprocess

import pytest
from scapy.layers.sctp import (
    SCTP,
    SCTPChunkAbort,
    SCTPChunkAddressConf,
    SCTPChunkCookieAck,
    SCTPChunkCookieEcho,
    SCTPChunkData,
    SCTPChunkError,
    SCTPChunkHeartbeatReq,
    SCTPChunkInit,
    SCTPChunkInitAck,
    SCTPChunkParamAddIPAddr,
    SCTPChunkParamIPv4Addr,
    SCTPChunkParamStateCookie,
    SCTPChunkSACK,
    SCTPChunkShutdown,
    SCTPChunkShutdownAck,
    SCTPChunkShutdownComplete,
)

import natrix_harness as h
from natrix_harness import IP, POOL1, SRV1, SRV2, SRV3, SUB_A, SUB_B, T0, Raw

SCTP_PROTO = 132
M_BIT, T_BIT = 0x02, 0x01
VTAG_AND_PORT_COLLISION, MISSING_STATE = 0x00B0, 0x00B1
ABORT, ERROR = 6, 9
CPORT, SPORT = 5000, 38412  # a client's port and S1AP's well-known port
NAT44_BIB_CREATE, NAT44_BIB_DELETE = 8, 9


# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------

def config(sctp=None, nat=None, timeouts=None, logging=None):
    cfg = h.make_config(nat=nat, timeouts=timeouts)
    if sctp:
        cfg += "[sctp]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in sctp.items())
    if logging:
        cfg += "[logging]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in logging.items())
    return cfg


def out_pkt(src, dst, tag, *chunks, sport=CPORT, dport=SPORT, ipid=1):
    """A frame from subscriber `src` to `dst`, SCTP with its CRC32c (scapy's)."""
    body = SCTP(sport=sport, dport=dport, tag=tag)
    for c in chunks:
        body = body / c
    return h.eth_in(src) / IP(src=src, dst=dst, ttl=64, id=ipid) / body


def in_pkt(src, dst, tag, *chunks, sport=SPORT, dport=CPORT, ipid=2):
    """A frame from remote `src` to the external address `dst`."""
    body = SCTP(sport=sport, dport=dport, tag=tag)
    for c in chunks:
        body = body / c
    return h.eth_out() / IP(src=src, dst=dst, ttl=64, id=ipid) / body


def init(tag):
    return SCTPChunkInit(init_tag=tag, a_rwnd=106496, n_out_streams=10, n_in_streams=10, init_tsn=1)


def init_ack(tag, params=()):
    return SCTPChunkInitAck(init_tag=tag, a_rwnd=106496, n_out_streams=10, n_in_streams=10, init_tsn=100,
                            params=[SCTPChunkParamStateCookie(cookie=b"cookie" * 4), *params])


def data(payload, tsn=1):
    return SCTPChunkData(tsn=tsn, stream_id=0, stream_seq=0, proto_id=0, beginning=1, ending=1, data=payload)


def vtags_param(int_tag, rem_tag, correlation=9):
    """draft-ietf-tsvwg-natsupp's VTags parameter (0xC008): scapy has none."""
    return struct.pack("!HHIII", 0xC008, 16, correlation, int_tag, rem_tag)


def asconf_raw(params: bytes, seq=1):
    """An ASCONF chunk (0xC1) with an IPv4 address parameter then `params`."""
    body = struct.pack("!I", seq) + bytes(SCTPChunkParamIPv4Addr(addr="0.0.0.0")) + params
    return Raw(struct.pack("!BBH", 0xC1, 0, 4 + len(body)) + body)


def handshake(sub, server, int_tag, rem_tag, t=T0, sport=CPORT):
    """INIT out, INIT-ACK in, COOKIE-ECHO out, COOKIE-ACK in (ext = POOL1)."""
    return [
        (t, "inside", out_pkt(sub, server, 0, init(int_tag), sport=sport)),
        (t + 0.01, "outside", in_pkt(server, POOL1, int_tag, init_ack(rem_tag), dport=sport)),
        (t + 0.02, "inside", out_pkt(sub, server, rem_tag, SCTPChunkCookieEcho(cookie=b"cookie" * 4), sport=sport)),
        (t + 0.03, "outside", in_pkt(server, POOL1, int_tag, SCTPChunkCookieAck(), dport=sport)),
    ]


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------

def is_sctp(p):
    return SCTP in p


def dat(p) -> bytes:
    """The user data of a packet's first DATA chunk."""
    return bytes(p[SCTPChunkData].data)


def sctp_bytes(o):
    raw = h.raw_of(o)
    off = h.ip_offset(raw)
    ihl = (raw[off] & 0xF) * 4
    total = struct.unpack("!H", raw[off + 2:off + 4])[0]
    return raw[off + ihl:off + total]


def crc_valid(b: bytes) -> bool:
    """scapy recomputes the CRC32c of the SCTP packet."""
    again = SCTP(b)
    again.chksum = None
    return bytes(again)[8:12] == b[8:12]


def chunk_at(b: bytes, at=12):
    """(type, flags, length, value) of the chunk at `at`."""
    t, f, n = struct.unpack("!BBH", b[at:at + 4])
    return t, f, n, b[at + 4:at + n]


def assert_untouched_sctp(o, sent):
    """Ports, tag, chunks and CRC32c exactly as sent: only addresses change."""
    got = sctp_bytes(o)
    want = bytes(sent[SCTP])
    assert got == want, f"SCTP bytes changed:\n got  {got.hex()}\n want {want.hex()}"
    assert crc_valid(got), "the forwarded CRC32c does not verify"


def run(replay, cfg, frames):
    outs, report = replay(cfg, frames)
    return outs, report


# ---------------------------------------------------------------------------
# 1. Associations keyed by tags and ports; addresses translated, ports and CRC never
# ---------------------------------------------------------------------------

def test_an_association_is_translated_by_address_only(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    d_out = out_pkt(SUB_A, SRV1, 0x2222, data(b"uplink"))
    d_in = in_pkt(SRV1, POOL1, 0x1111, SCTPChunkSACK(cumul_tsn_ack=1, a_rwnd=4096), data(b"downlink", tsn=100))
    frames = hs + [(T0 + 1, "inside", d_out), (T0 + 1.1, "outside", d_in)]
    outs, report = run(replay, config(), frames)
    out = h.pick(outs, "outside", is_sctp)
    inn = h.pick(outs, "inside", is_sctp)
    assert len(out) == 3 and len(inn) == 3, h.dump(outs)
    for o, (_, _, sent) in zip(out, [frames[0], frames[2], frames[4]]):
        assert (o.pkt[IP].src, o.pkt[IP].dst) == (POOL1, SRV1)
        assert_untouched_sctp(o, sent)
    for o, (_, _, sent) in zip(inn, [frames[1], frames[3], frames[5]]):
        assert (o.pkt[IP].src, o.pkt[IP].dst) == (SRV1, SUB_A)
        assert_untouched_sctp(o, sent)
    assert report["drops"] == {}
    assert report["mappings_created"] == 1


def test_two_subscribers_on_one_port_to_one_server_are_told_apart_by_their_tags(replay):
    a = handshake(SUB_A, SRV1, 0xAAAA0001, 0xBBBB0001)
    b = handshake(SUB_B, SRV1, 0xAAAA0002, 0xBBBB0002, t=T0 + 0.5)
    downlink = [
        (T0 + 2, "outside", in_pkt(SRV1, POOL1, 0xAAAA0002, data(b"to-b"))),
        (T0 + 2.1, "outside", in_pkt(SRV1, POOL1, 0xAAAA0001, data(b"to-a"))),
    ]
    outs, report = run(replay, config(), a + b + downlink)
    out = h.pick(outs, "outside", is_sctp)
    assert {(o.pkt[IP].src, o.pkt[SCTP].sport) for o in out} == {(POOL1, CPORT)}, "one external address, the port untouched"
    to_b = h.one(outs, "inside", lambda p: SCTPChunkData in p and dat(p) == b"to-b")
    to_a = h.one(outs, "inside", lambda p: SCTPChunkData in p and dat(p) == b"to-a")
    assert to_b.pkt[IP].dst == SUB_B and to_a.pkt[IP].dst == SUB_A
    acks = h.pick(outs, "inside", lambda p: SCTPChunkInitAck in p)
    assert [o.pkt[IP].dst for o in acks] == [SUB_A, SUB_B]
    assert report["drops"] == {}


# ---------------------------------------------------------------------------
# 2. States, teardown, T bit, idle timeouts
# ---------------------------------------------------------------------------

def test_shutdown_complete_ends_the_association_once_forwarded(replay, tmp_path):
    log = tmp_path / "ev.jsonl"
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    close = [
        (T0 + 1, "inside", out_pkt(SUB_A, SRV1, 0x2222, SCTPChunkShutdown(cumul_tsn_ack=99))),
        (T0 + 1.1, "outside", in_pkt(SRV1, POOL1, 0x1111, SCTPChunkShutdownAck())),
        (T0 + 1.2, "inside", out_pkt(SUB_A, SRV1, 0x2222, SCTPChunkShutdownComplete())),
        (T0 + 2, "outside", in_pkt(SRV1, POOL1, 0x1111, data(b"late"))),
        (T0 + 2.1, "inside", out_pkt(SUB_A, SRV1, 0x2222, data(b"late"))),
    ]
    outs, report = run(replay, config(logging={"json": str(log)}), hs + close)
    assert h.one(outs, "outside", lambda p: SCTPChunkShutdownComplete in p).pkt[IP].src == POOL1
    h.none_of(outs, None, lambda p: SCTPChunkData in p, "DATA after the association ended")
    assert report["drops"] == {"sctp_no_association": 2}
    # The inside packet is answered (reply_ootb = "inside"), the outside one is not.
    err = h.one(outs, "inside", lambda p: SCTPChunkError in p, "ERROR-M")
    assert err.pkt[IP].dst == SUB_A
    h.none_of(outs, "outside", lambda p: SCTPChunkError in p)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["nat_event"], e["proto"], e["subscriber"], e["subscriber_port"], e["external"], e["external_port"]) for e in events] == [
        (NAT44_BIB_CREATE, "sctp", SUB_A, CPORT, POOL1, CPORT),
        (NAT44_BIB_DELETE, "sctp", SUB_A, CPORT, POOL1, CPORT),
    ]


@pytest.mark.parametrize("from_side", ["outside", "inside"])
def test_an_abort_with_the_t_bit_is_found_by_its_senders_own_tag(replay, from_side):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    if from_side == "outside":
        # T bit: the server's own tag (RFC 9260 section 8.5.1), not the client's.
        abort = in_pkt(SRV1, POOL1, 0x2222, SCTPChunkAbort(TCB=1))
        after = in_pkt(SRV1, POOL1, 0x1111, data(b"late"))
    else:
        abort = out_pkt(SUB_A, SRV1, 0x1111, SCTPChunkAbort(TCB=1))
        after = out_pkt(SUB_A, SRV1, 0x2222, data(b"late"))
    outs, report = run(replay, config(), hs + [(T0 + 1, from_side, abort), (T0 + 2, from_side, after)])
    to = "inside" if from_side == "outside" else "outside"
    got = h.one(outs, to, lambda p: SCTPChunkAbort in p, "the forwarded ABORT")
    assert_untouched_sctp(got, abort)
    h.none_of(outs, to, lambda p: SCTPChunkData in p)
    assert report["drops"] == {"sctp_no_association": 1}


def test_an_abort_without_the_t_bit_ends_it_too(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    frames = hs + [(T0 + 1, "outside", in_pkt(SRV1, POOL1, 0x1111, SCTPChunkAbort())),
                   (T0 + 2, "outside", in_pkt(SRV1, POOL1, 0x1111, data(b"late")))]
    outs, report = run(replay, config(), frames)
    h.one(outs, "inside", lambda p: SCTPChunkAbort in p)
    assert report["drops"] == {"sctp_no_association": 1}


def test_an_init_without_an_init_ack_idles_out_after_sctp_init(replay):
    frames = [
        (T0, "inside", out_pkt(SUB_A, SRV1, 0, init(0x1111))),
        (T0 + 16, "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x2222))),
    ]
    outs, report = run(replay, config(), frames)
    h.none_of(outs, "inside", lambda p: SCTPChunkInitAck in p)
    assert report["drops"] == {"sctp_no_association": 1}
    outs, report = run(replay, config(timeouts={"sctp_init": "30s"}), frames)
    h.one(outs, "inside", lambda p: SCTPChunkInitAck in p)


def test_an_established_association_idles_out_after_sctp(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    frames = hs + [
        (T0 + 200, "outside", in_pkt(SRV1, POOL1, 0x1111, SCTPChunkHeartbeatReq())),  # refreshes
        (T0 + 450, "outside", in_pkt(SRV1, POOL1, 0x1111, data(b"within"))),
        (T0 + 800, "outside", in_pkt(SRV1, POOL1, 0x1111, data(b"after"))),
    ]
    outs, report = run(replay, config(), frames)
    h.one(outs, "inside", lambda p: SCTPChunkData in p and dat(p) == b"within")
    h.none_of(outs, "inside", lambda p: SCTPChunkData in p and dat(p) == b"after")
    assert report["drops"] == {"sctp_no_association": 1}


def test_a_retransmitted_init_keeps_its_association(replay):
    frames = [
        (T0, "inside", out_pkt(SUB_A, SRV1, 0, init(0x1111))),
        (T0 + 1, "inside", out_pkt(SUB_A, SRV1, 0, init(0x1111))),
        (T0 + 1.5, "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x2222))),
    ]
    outs, report = run(replay, config(), frames)
    assert len(h.pick(outs, "outside", lambda p: SCTPChunkInit in p)) == 2
    h.one(outs, "inside", lambda p: SCTPChunkInitAck in p)
    assert report["mappings_created"] == 1


def init_sent_again_and_two_init_acks(first_ack_at):
    """An INIT, the remote's INIT-ACK (tag 0x2222) passing natrix at
    `first_ack_at`, the INIT sent again at T0 + 1 and the remote's answer
    to it with a new tag (0x3333)."""
    return [
        (T0, "inside", out_pkt(SUB_A, SRV1, 0, init(0x1111))),
        (first_ack_at, "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x2222))),
        (T0 + 1, "inside", out_pkt(SUB_A, SRV1, 0, init(0x1111))),
        (T0 + 1.01, "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x3333))),
    ]


def test_an_init_ack_lost_on_its_way_in_gives_way_to_the_answer_to_the_init_sent_again(replay):
    """RFC 9260 section 5.1: a remote without state answers each INIT with
    an INIT-ACK of a new Initiate Tag. The first one is lost between the
    NAT and the host (it passed the NAT); the host sends its INIT again and
    takes the second, so its COOKIE-ECHO and DATA carry the second tag, and
    the association must go on with it. A later INIT-ACK (a duplicate the
    remote sent) no longer changes the tag once the host has used it."""
    frames = init_sent_again_and_two_init_acks(first_ack_at=T0 + 0.01) + [
        (T0 + 1.02, "inside", out_pkt(SUB_A, SRV1, 0x3333, SCTPChunkCookieEcho(cookie=b"cookie" * 4))),
        (T0 + 1.03, "outside", in_pkt(SRV1, POOL1, 0x1111, SCTPChunkCookieAck())),
        (T0 + 1.04, "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x4444))),
        (T0 + 1.05, "inside", out_pkt(SUB_A, SRV1, 0x3333, data(b"uplink"))),
        (T0 + 1.06, "outside", in_pkt(SRV1, POOL1, 0x3333, SCTPChunkAbort(TCB=1))),
    ]
    outs, report = run(replay, config(), frames)
    h.one(outs, "outside", lambda p: SCTPChunkCookieEcho in p)
    up = h.one(outs, "outside", lambda p: SCTPChunkData in p)
    assert (up.pkt[IP].src, up.pkt[SCTP].tag) == (POOL1, 0x3333)
    abort = h.one(outs, "inside", lambda p: SCTPChunkAbort in p)
    assert abort.pkt[IP].dst == SUB_A, "the remote's own tag (T bit) is still 0x3333"
    assert report["drops"] == {}, report["drops"]
    assert report["mappings_created"] == 1


def test_a_duplicate_init_ack_without_an_init_sent_again_changes_nothing(replay):
    """RFC 9260 section 5.2.3: a host past COOKIE-WAIT discards an INIT-ACK.
    Two INIT-ACKs for one INIT (the remote answered a duplicated INIT) both
    pass natrix before the host's COOKIE-ECHO: the host took the first, and
    its COOKIE-ECHO with the first tag must pass."""
    frames = [
        (T0, "inside", out_pkt(SUB_A, SRV1, 0, init(0x1111))),
        (T0 + 0.01, "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x2222))),
        (T0 + 0.011, "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x3333))),
        (T0 + 0.02, "inside", out_pkt(SUB_A, SRV1, 0x2222, SCTPChunkCookieEcho(cookie=b"cookie" * 4))),
    ]
    outs, report = run(replay, config(), frames)
    echo = h.one(outs, "outside", lambda p: SCTPChunkCookieEcho in p)
    assert echo.pkt[SCTP].tag == 0x2222
    assert report["drops"] == {}, report["drops"]


def test_an_init_ack_only_delayed_still_counts_after_a_second_passed(replay):
    """The first INIT-ACK is delayed, not lost, on its way to the host: the
    host sends its INIT again, and the remote's second INIT-ACK (a new tag,
    RFC 9260 section 5.1) passes natrix before the host's COOKIE-ECHO. The
    host took the first (section 5.2.3), so its COOKIE-ECHO carries the
    first tag and must pass; then the second tag finds nothing."""
    frames = init_sent_again_and_two_init_acks(first_ack_at=T0 + 0.9) + [
        (T0 + 1.02, "inside", out_pkt(SUB_A, SRV1, 0x2222, SCTPChunkCookieEcho(cookie=b"cookie" * 4))),
        (T0 + 1.03, "inside", out_pkt(SUB_A, SRV1, 0x3333, data(b"stale"))),
    ]
    outs, report = run(replay, config(), frames)
    echo = h.one(outs, "outside", lambda p: SCTPChunkCookieEcho in p)
    assert echo.pkt[SCTP].tag == 0x2222
    assert not h.pick(outs, "outside", lambda p: SCTPChunkData in p), "the second tag was forgotten once the host used the first"
    assert report["drops"] == {"sctp_no_association": 1}, report["drops"]


def test_nothing_is_opened_from_outside(replay):
    frames = [(T0, "outside", in_pkt(SRV1, POOL1, 0, init(0x1111), sport=SPORT, dport=CPORT))]
    outs, report = run(replay, config(), frames)
    assert outs == [] and report["drops"] == {"sctp_no_association": 1}


# ---------------------------------------------------------------------------
# 3. Collisions (seed 001 section 5.2.1) and out-of-the-blue packets (section 3.3)
# ---------------------------------------------------------------------------

def test_a_colliding_init_is_answered_with_an_abort_m_back_to_its_sender(replay):
    frames = [
        (T0, "inside", out_pkt(SUB_A, SRV1, 0, init(0x5EED))),
        (T0 + 1, "inside", out_pkt(SUB_B, SRV1, 0, init(0x5EED))),
    ]
    outs, report = run(replay, config(), frames)
    assert len(h.pick(outs, "outside", is_sctp)) == 1, "nothing of the colliding INIT leaves outside"
    abort = h.one(outs, "inside", lambda p: SCTPChunkAbort in p, "ABORT-M")
    assert (abort.pkt[IP].src, abort.pkt[IP].dst) == (SRV1, SUB_B), "addresses swapped"
    b = sctp_bytes(abort)
    sport, dport, tag = struct.unpack("!HHI", b[:8])
    assert (sport, dport) == (SPORT, CPORT), "ports swapped"
    assert tag == 0x5EED, "the verification tag is the INIT's Initiate Tag (RFC 9260 section 8.4)"
    assert crc_valid(b)
    ctype, flags, length, value = chunk_at(b)
    assert (ctype, flags) == (ABORT, M_BIT), "M bit set, T bit clear"
    code, clen = struct.unpack("!HH", value[:4])
    assert code == VTAG_AND_PORT_COLLISION
    assert value[4:clen] == bytes(init(0x5EED)), "the cause carries the INIT chunk"
    assert report["drops"] == {"sctp_collision": 1}


def test_the_same_tag_towards_another_server_is_no_collision(replay):
    frames = [
        (T0, "inside", out_pkt(SUB_A, SRV1, 0, init(0x5EED))),
        (T0 + 1, "inside", out_pkt(SUB_B, SRV2, 0, init(0x5EED))),
        (T0 + 2, "outside", in_pkt(SRV2, POOL1, 0x5EED, init_ack(0x77))),
        (T0 + 3, "outside", in_pkt(SRV1, POOL1, 0x5EED, init_ack(0x66))),
    ]
    outs, report = run(replay, config(), frames)
    assert len(h.pick(outs, "outside", is_sctp)) == 2
    acks = h.pick(outs, "inside", lambda p: SCTPChunkInitAck in p)
    assert [(o.pkt[IP].src, o.pkt[IP].dst) for o in acks] == [(SRV2, SUB_B), (SRV1, SUB_A)], "the remote address tells them apart"
    assert report["drops"] == {}


def test_out_of_the_blue_from_inside_gets_error_m_missing_state(replay):
    sent = out_pkt(SUB_A, SRV1, 0xDEAD, data(b"orphan"))
    outs, report = run(replay, config(), [(T0, "inside", sent)])
    err = h.one(outs, "inside", lambda p: SCTPChunkError in p, "ERROR-M")
    assert (err.pkt[IP].src, err.pkt[IP].dst) == (SRV1, SUB_A)
    b = sctp_bytes(err)
    assert struct.unpack("!HHI", b[:8]) == (SPORT, CPORT, 0xDEAD), "ports swapped, the packet's own tag reflected"
    assert crc_valid(b)
    ctype, flags, _, value = chunk_at(b)
    assert (ctype, flags) == (ERROR, M_BIT | T_BIT)
    code, clen = struct.unpack("!HH", value[:4])
    assert code == MISSING_STATE
    assert value[4:clen] == bytes(sent[IP]), "the cause carries the packet, IPv4 header included"
    h.none_of(outs, "outside", is_sctp)
    assert report["drops"] == {"sctp_no_association": 1}


@pytest.mark.parametrize("chunk", [SCTPChunkAbort(), SCTPChunkShutdownComplete(), SCTPChunkError(), SCTPChunkAbort(TCB=1)])
def test_an_unmatched_abort_shutdown_complete_or_error_is_never_answered(replay, chunk):
    outs, report = run(replay, config(sctp={"reply_ootb": "both"}), [(T0, "inside", out_pkt(SUB_A, SRV1, 0xDEAD, chunk)),
                                                                     (T0 + 1, "outside", in_pkt(SRV1, POOL1, 0xDEAD, chunk))])
    assert outs == [], h.dump(outs)
    assert report["drops"] == {"sctp_no_association": 2}


@pytest.mark.parametrize("reply_ootb,inside_answered,outside_answered", [
    ("inside", True, False), ("both", True, True), ("none", False, False)])
def test_reply_ootb_says_who_is_answered(replay, reply_ootb, inside_answered, outside_answered):
    frames = [(T0, "inside", out_pkt(SUB_A, SRV1, 0xDEAD, data(b"x"))),
              (T0 + 1, "outside", in_pkt(SRV1, POOL1, 0xBEEF, data(b"y")))]
    outs, report = run(replay, config(sctp={"reply_ootb": reply_ootb}), frames)
    assert bool(h.pick(outs, "inside", lambda p: SCTPChunkError in p)) == inside_answered
    answered_out = h.pick(outs, "outside", lambda p: SCTPChunkError in p)
    assert bool(answered_out) == outside_answered
    if answered_out:
        o = answered_out[0]
        assert (o.pkt[IP].src, o.pkt[IP].dst) == (POOL1, SRV1)
        b = sctp_bytes(o)
        assert struct.unpack("!HHI", b[:8]) == (CPORT, SPORT, 0xBEEF) and chunk_at(b)[1] == M_BIT | T_BIT
    h.none_of(outs, None, lambda p: SCTPChunkData in p)
    assert report["drops"] == {"sctp_no_association": 2}


# ---------------------------------------------------------------------------
# 4. Multi-homing: ASCONF with VTags; global address tracking
# ---------------------------------------------------------------------------

def test_an_asconf_with_vtags_opens_the_association_it_names(replay):
    """draft-ietf-tsvwg-natsupp "Handling of Missing State": the NAT lost the
    INIT (or never saw it, a second path): the ASCONF's VTags restore it."""
    asconf = asconf_raw(bytes(SCTPChunkParamAddIPAddr(correlation_id=1, addr_type=5, addr="0.0.0.0")) + vtags_param(0x1111, 0x2222))
    frames = [
        (T0, "inside", out_pkt(SUB_A, SRV1, 0x2222, asconf)),
        (T0 + 1, "outside", in_pkt(SRV1, POOL1, 0x1111, data(b"reached"))),
    ]
    outs, report = run(replay, config(), frames)
    sent = h.one(outs, "outside", is_sctp)
    assert sent.pkt[IP].src == POOL1
    assert_untouched_sctp(sent, frames[0][2])
    assert h.one(outs, "inside", lambda p: SCTPChunkData in p).pkt[IP].dst == SUB_A
    assert report["drops"] == {}


def test_an_asconf_whose_vtags_collide_gets_error_m(replay):
    asconf = asconf_raw(vtags_param(0x5EED, 0x9999))
    frames = handshake(SUB_A, SRV1, 0x5EED, 0x2222) + [(T0 + 1, "inside", out_pkt(SUB_B, SRV1, 0x9999, asconf))]
    outs, report = run(replay, config(), frames)
    err = h.one(outs, "inside", lambda p: p[IP].dst == SUB_B and is_sctp(p), "ERROR-M to SUB_B")
    ctype, flags, _, value = chunk_at(sctp_bytes(err))
    assert (ctype, flags & M_BIT) == (ERROR, M_BIT)
    assert struct.unpack("!H", value[:2])[0] == VTAG_AND_PORT_COLLISION
    assert report["drops"] == {"sctp_collision": 1}


def test_tracked_global_addresses_come_from_the_init_ack_and_asconf(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    hs[1] = (hs[1][0], "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x2222, [SCTPChunkParamIPv4Addr(addr=SRV2)])))
    add_srv3 = asconf_raw(bytes(SCTPChunkParamAddIPAddr(correlation_id=1, addr_type=5, addr="0.0.0.0")))
    frames = hs + [
        (T0 + 1, "outside", in_pkt(SRV2, POOL1, 0x1111, data(b"via-srv2"))),
        (T0 + 2, "outside", in_pkt(SRV3, POOL1, 0x1111, data(b"via-srv3"))),
        (T0 + 3, "outside", in_pkt(SRV3, POOL1, 0x1111, add_srv3)),
        (T0 + 4, "outside", in_pkt(SRV3, POOL1, 0x1111, data(b"srv3-added"))),
    ]
    outs, report = run(replay, config(sctp={"track_global_addresses": 3}), frames)
    got = [dat(o.pkt) for o in h.pick(outs, "inside", lambda p: SCTPChunkData in p)]
    assert got == [b"via-srv2", b"srv3-added"]
    # Tags and ports match but the source is not tracked: seed 001 section 3.3 case 2 answers it.
    err = h.one(outs, "outside", lambda p: SCTPChunkError in p)
    assert err.pkt[IP].dst == SRV3 and struct.unpack("!H", chunk_at(sctp_bytes(err))[3][:2])[0] == MISSING_STATE
    assert report["drops"] == {"sctp_no_association": 1}
    # Off (the default): any source with the tags and ports passes.
    outs, report = run(replay, config(), frames)
    assert len(h.pick(outs, "inside", lambda p: SCTPChunkData in p)) == 3


def test_tracking_stops_at_the_configured_number(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    hs[1] = (hs[1][0], "outside", in_pkt(SRV1, POOL1, 0x1111, init_ack(0x2222, [SCTPChunkParamIPv4Addr(addr=SRV2), SCTPChunkParamIPv4Addr(addr=SRV3)])))
    frames = hs + [(T0 + 1, "outside", in_pkt(SRV2, POOL1, 0x1111, data(b"2"))), (T0 + 2, "outside", in_pkt(SRV3, POOL1, 0x1111, data(b"3")))]
    outs, _ = run(replay, config(sctp={"track_global_addresses": 2, "reply_ootb": "none"}), frames)
    assert [dat(o.pkt) for o in h.pick(outs, "inside", lambda p: SCTPChunkData in p)] == [b"2"], "SRV1 and SRV2: two"


# ---------------------------------------------------------------------------
# 5. Limits: chunk and parameter floods, zero and overlong lengths
# ---------------------------------------------------------------------------

def test_a_chunk_flood_is_forwarded_and_examined_no_further_than_max_chunks(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    flood = [SCTPChunkHeartbeatReq() for _ in range(300)] + [SCTPChunkAbort()]
    frames = hs + [(T0 + 1, "outside", in_pkt(SRV1, POOL1, 0x1111, *flood)),
                   (T0 + 2, "outside", in_pkt(SRV1, POOL1, 0x1111, data(b"still-up")))]
    outs, report = run(replay, config(), frames)
    fwd = h.one(outs, "inside", lambda p: SCTPChunkHeartbeatReq in p, "the flood")
    assert_untouched_sctp(fwd, frames[4][2])
    h.one(outs, "inside", lambda p: SCTPChunkData in p, "DATA: the ABORT past max_chunks was not examined")
    assert report["drops"] == {}
    outs, report = run(replay, config(sctp={"max_chunks": 375}), frames)
    h.none_of(outs, "inside", lambda p: SCTPChunkData in p)


def test_data_chunks_need_no_examination_and_never_cause_a_drop(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    many = [data(b"d%03d" % i, tsn=i + 1) for i in range(40)]
    outs, report = run(replay, config(), hs + [(T0 + 1, "inside", out_pkt(SUB_A, SRV1, 0x2222, *many))])
    assert_untouched_sctp(h.one(outs, "outside", lambda p: SCTPChunkData in p), out_pkt(SUB_A, SRV1, 0x2222, *many))
    assert report["drops"] == {}


@pytest.mark.parametrize("length", [0, 3, 4000])
def test_zero_short_and_overlong_chunk_lengths_are_dropped_as_malformed(replay, length):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    bad = out_pkt(SUB_A, SRV1, 0x2222, SCTPChunkHeartbeatReq(len=length))
    outs, report = run(replay, config(), hs + [(T0 + 1, "inside", bad)])
    assert len(h.pick(outs, "outside", is_sctp)) == 2, "only the handshake's two leave"
    assert report["drops"] == {"sctp_malformed": 1}


def test_a_parameter_flood_is_examined_no_further_than_max_params(replay):
    filler = b"".join(bytes(SCTPChunkParamIPv4Addr(addr="192.0.2.%d" % i)) for i in range(40))
    late = asconf_raw(filler + vtags_param(0x1111, 0x2222))
    early = asconf_raw(vtags_param(0x1111, 0x2222) + filler)
    outs, report = run(replay, config(), [(T0, "inside", out_pkt(SUB_A, SRV1, 0x2222, late))])
    h.none_of(outs, "outside", is_sctp)
    h.one(outs, "inside", lambda p: SCTPChunkError in p, "ERROR-M: the VTags past max_params were not seen")
    assert report["drops"] == {"sctp_no_association": 1}
    outs, report = run(replay, config(sctp={"max_params": 60}), [(T0, "inside", out_pkt(SUB_A, SRV1, 0x2222, late))])
    h.one(outs, "outside", is_sctp)
    outs, report = run(replay, config(), [(T0, "inside", out_pkt(SUB_A, SRV1, 0x2222, early))])
    h.one(outs, "outside", is_sctp)


def test_a_zero_length_parameter_is_malformed_only_when_examined(replay):
    zero = struct.pack("!HH", 0xC001, 0)
    examined = asconf_raw(zero + vtags_param(0x1111, 0x2222))
    outs, report = run(replay, config(), [(T0, "inside", out_pkt(SUB_A, SRV1, 0x2222, examined))])
    assert outs == [] and report["drops"] == {"sctp_malformed": 1}
    filler = b"".join(bytes(SCTPChunkParamIPv4Addr(addr="192.0.2.%d" % i)) for i in range(30))
    unexamined = asconf_raw(vtags_param(0x1111, 0x2222) + filler + zero)
    outs, report = run(replay, config(), [(T0, "inside", out_pkt(SUB_A, SRV1, 0x2222, unexamined))])
    h.one(outs, "outside", is_sctp)
    assert report["drops"] == {}


def test_an_init_with_a_tag_or_a_zero_initiate_tag_is_malformed(replay):
    frames = [(T0, "inside", out_pkt(SUB_A, SRV1, 7, init(0x1111))), (T0 + 1, "inside", out_pkt(SUB_A, SRV1, 0, init(0)))]
    outs, report = run(replay, config(), frames)
    assert outs == [] and report["drops"] == {"sctp_malformed": 2}


# ---------------------------------------------------------------------------
# 6. The subscriber machinery: quotas, logging, whois, determinism
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("nat", [{"max_ports_per_protocol": {"sctp": 1}}, {"max_sessions_per_subscriber": 1}])
def test_each_association_is_a_session_and_a_port_use(replay, nat):
    frames = [(T0, "inside", out_pkt(SUB_A, SRV1, 0, init(0x1))), (T0 + 1, "inside", out_pkt(SUB_A, SRV2, 0, init(0x2), sport=6000))]
    outs, report = run(replay, config(nat=nat), frames)
    assert len(h.pick(outs, "outside", is_sctp)) == 1
    assert sum(report["drops"].values()) == 1 and set(report["drops"]) <= {"port_quota", "session_quota"}


def test_an_association_uses_the_subscribers_paired_address(replay):
    pool = "203.0.113.0/29"
    frames = [(T0, "inside", h.udp_out(SUB_A, 40000, SRV1, 53)), (T0 + 1, "inside", out_pkt(SUB_A, SRV1, 0, init(0x1)))]
    outs, _ = replay(h.make_config(pool=[pool]), frames)
    udp = h.one(outs, "outside", h.is_udp)
    sctp = h.one(outs, "outside", is_sctp)
    assert sctp.pkt[IP].src == udp.pkt[IP].src, "RFC 4787 REQ-2 paired pooling"


def test_whois_answers_every_subscriber_that_held_the_address_and_port(replay, natrix, tmp_path):
    log = tmp_path / "events.jsonl"
    frames = handshake(SUB_A, SRV1, 0xA1, 0xB1) + handshake(SUB_B, SRV1, 0xA2, 0xB2, t=T0 + 10)
    replay(config(logging={"json": str(log)}), frames)
    p = natrix("whois", f"{POOL1}:{CPORT}", "--proto", "sctp", "--at", str(T0 + 20), "--log", log, "--json")
    assert p.returncode == 0, h.proc_text(p)
    answers = json.loads(p.stdout)["answers"]
    assert sorted((a["subscriber"], a["proto"], a["external_port"]) for a in answers) == [(SUB_A, "sctp", CPORT), (SUB_B, "sctp", CPORT)]
    p = natrix("whois", f"{POOL1}:{CPORT}", "--proto", "sctp", "--at", str(T0 + 5), "--log", log, "--json")
    assert [a["subscriber"] for a in json.loads(p.stdout)["answers"]] == [SUB_A]


def test_the_same_capture_gives_the_same_bytes(replay_files):
    frames = handshake(SUB_A, SRV1, 0x1111, 0x2222) + [
        (T0 + 1, "inside", out_pkt(SUB_B, SRV1, 0, init(0x1111))),
        (T0 + 2, "inside", out_pkt(SUB_B, SRV2, 0xDEAD, data(b"x"))),
    ]
    cfg = config()
    p1, d1 = replay_files(cfg, frames)
    p2, d2 = replay_files(cfg, frames)
    assert p1.returncode == 0 and p2.returncode == 0
    assert (d1 / "out.pcapng").read_bytes() == (d2 / "out.pcapng").read_bytes()
    assert (d1 / "r.json").read_text() == (d2 / "r.json").read_text()


# ---------------------------------------------------------------------------
# ICMP errors about SCTP and fragments
# ---------------------------------------------------------------------------

def test_an_icmp_error_about_an_association_reaches_its_subscriber(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    sent = out_pkt(SUB_A, SRV1, 0x2222, data(b"big"))
    outs, _ = replay(config(), hs + [(T0 + 1, "inside", sent)])
    translated = h.ip_bytes(h.one(outs, "outside", lambda p: SCTPChunkData in p).pkt)
    err = h.icmp_error(h.eth_out(), "192.0.2.254", POOL1, translated, icmp_type=3, code=4)
    outs, report = replay(config(), hs + [(T0 + 1, "inside", sent), (T0 + 2, "outside", err)])
    e = h.one(outs, "inside", h.is_icmp_error, "the ICMP error")
    quoted = IP(bytes(e.pkt[h.ICMP].payload))
    assert e.pkt[IP].dst == SUB_A and quoted.src == SUB_A and quoted.dst == SRV1
    assert bytes(quoted[SCTP])[:8] == bytes(sent[SCTP])[:8], "the quoted SCTP header is untouched"


def test_fragments_of_an_sctp_packet_are_translated(replay):
    hs = handshake(SUB_A, SRV1, 0x1111, 0x2222)
    big = out_pkt(SUB_A, SRV1, 0x2222, data(b"z" * 2000), ipid=77)
    frags = h.fragment(big[IP], fragsize=1000)
    frames = hs + [(T0 + 1 + i * 0.01, "inside", h.eth_in(SUB_A) / f) for i, f in enumerate(frags)]
    outs, report = replay(config(), frames)
    pieces = h.pick(outs, "outside", lambda p: IP in p and p[IP].id == 77)
    assert len(pieces) == len(frags) and all(o.pkt[IP].src == POOL1 for o in pieces)
    whole = h.defragment([o.pkt[IP] for o in pieces])[0]
    assert crc_valid(bytes(whole[SCTP])) and bytes(whole[SCTP]) == bytes(big[SCTP])
    assert report["drops"] == {}


def test_tshark_reads_natrix_answers_as_valid_sctp(replay, tmp_path):
    """An independent decoder (tshark's SCTP dissector with CRC32c checking)
    agrees on what natrix sends itself."""
    import shutil
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed")
    frames = [(T0, "inside", out_pkt(SUB_A, SRV1, 0, init(0x5EED))), (T0 + 1, "inside", out_pkt(SUB_B, SRV1, 0, init(0x5EED))),
              (T0 + 2, "inside", out_pkt(SUB_A, SRV1, 0xDEAD, data(b"x")))]
    proc, d = h.run_replay_files(config(), frames, tmp_path)
    assert proc.returncode == 0
    tshark = subprocess.run(["tshark", "-r", str(d / "out.pcapng"), "-o", "sctp.checksum:CRC-32C", "-T", "fields",
                             "-e", "sctp.chunk_type", "-e", "sctp.checksum.status", "-e", "sctp.cause_code", "-Y", "sctp"],
                            capture_output=True, text=True, timeout=60)
    rows = [line.split("\t") for line in tshark.stdout.splitlines()]
    assert len(rows) == 3, tshark.stdout + tshark.stderr
    assert all(r[1] == "1" for r in rows), f"tshark finds a bad CRC32c: {rows}"
    assert [(r[0], r[2]) for r in rows] == [("1", ""), ("6", "0x00b0"), ("9", "0x00b1")], "the INIT forwarded, ABORT-M, ERROR-M"


def test_ipfix_says_protocol_132_and_block_mode_still_logs_associations(natrix_bin, tmp_path):
    """An association holds no port block (its port is its own): its mapping
    records are exported in block mode too, with protocolIdentifier 132, as
    tshark's IPFIX dissector decodes them."""
    from test_ipfix import check_stream, export
    capture = tmp_path / "in.pcapng"
    frames = handshake(SUB_A, SRV1, 0x1111, 0x2222) + [(T0 + 1, "inside", out_pkt(SUB_A, SRV1, 0x2222, SCTPChunkAbort()))]
    h.write_pcapng(capture, frames)
    records, messages = export(natrix_bin, tmp_path, config(nat={"port_block_size": 64}), capture, unit="block")
    assert [(r["event"], r["proto"], r["subscriber"], r["external"], r["external_port"]) for r in records] == [
        ("mapping_create", "sctp", SUB_A, POOL1, CPORT), ("mapping_delete", "sctp", SUB_A, POOL1, CPORT)]
    data = check_stream(messages)
    assert [int(d["cflow.nat_event"]) for _, d in data] == [NAT44_BIB_CREATE, NAT44_BIB_DELETE]
    for _, d in data:
        assert int(d["cflow.protocol"]) == SCTP_PROTO
        assert (d["cflow.srcaddr"], d["cflow.post_natsource_ipv4_address"]) == (SUB_A, POOL1)
        assert int(d["cflow.srcport"]) == CPORT == int(d["cflow.post_naptsource_transport_port"])


DET = h.make_config(pool=("203.0.113.0/31",), nat={
    "mode": "deterministic", "subscribers": ["100.64.0.0/26", "100.64.1.0/27"], "ports_per_subscriber": 1008,
})


def test_deterministic_mode_uses_the_formula_address_and_whois_names_its_subscribers(replay, natrix, tmp_path):
    """RFC 7422: subscriber 70 (100.64.1.6) is on the second pool address. An
    SCTP association leaves from it with the subscriber's own port, so the
    formula alone can only say which subscribers share that address."""
    sub = "100.64.1.6"
    outs, _ = replay(DET, [(T0, "inside", out_pkt(sub, SRV1, 0, init(0x77), sport=CPORT))])
    o = h.one(outs, "outside", is_sctp)
    assert (o.pkt[IP].src, o.pkt[SCTP].sport) == ("203.0.113.1", CPORT)
    cfg = tmp_path / "det.toml"
    cfg.write_text(DET)
    p = natrix("whois", f"203.0.113.1:{CPORT}", "--proto", "sctp", "--config", cfg, "--json")
    assert p.returncode == 0, h.proc_text(p)
    named = {a["subscriber"] for a in json.loads(p.stdout)["answers"]}
    assert sub in named and len(named) == 32, "subscribers 64-95: the second address's"
    p = natrix("whois", f"203.0.113.1:{CPORT}", "--config", cfg, "--json")
    assert all(a["proto"] != "sctp" for a in json.loads(p.stdout)["answers"]), "SCTP answers only when asked"
