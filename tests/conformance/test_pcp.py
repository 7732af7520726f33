"""PCP server (RFC 6887) on natrix's inside address, UDP 5351, through
`natrix replay` with `[pcp] enabled = true`.

Requests are packed here with struct from the RFC's figures (never by
natrix), carried in scapy frames; natrix's answers are decoded by tshark's
own Port Control dissector (`portcontrol`), an independent decoder, and
their IP/UDP checksums verified by the harness.
"""

import json
import os
import random
import shutil
import struct
import subprocess

import pytest

import natrix_harness as h
from natrix_harness import IP, POOL1, SRV1, SRV2, SUB_A, SUB_B, T0, UDP, Raw

TSHARK = shutil.which("tshark")
needs_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark (Wireshark's PCP dissector) is not installed")

PCP_PORT = 5351
CPORT = 40404
NONCE = b"conformance!"

SUCCESS, UNSUPP_VERSION, NOT_AUTHORIZED, MALFORMED_REQUEST, UNSUPP_OPCODE = 0, 1, 2, 3, 4
UNSUPP_OPTION, MALFORMED_OPTION, UNSUPP_PROTOCOL, USER_EX_QUOTA = 5, 6, 9, 10
CANNOT_PROVIDE_EXTERNAL, ADDRESS_MISMATCH = 11, 12


def mapped(addr):
    """IPv4-mapped IPv6 address, 16 bytes (RFC 6887 section 5)."""
    return b"\x00" * 10 + b"\xff\xff" + bytes(int(x) for x in addr.split("."))


def header(opcode, lifetime, client, version=2):
    """Figure 2: request header."""
    return struct.pack("!BBHI", version, opcode, 0, lifetime) + mapped(client)


def map_body(proto, iport, sport=0, saddr=None, nonce=NONCE):
    """Figure 9: MAP opcode data."""
    return nonce + struct.pack("!B3xHH", proto, iport, sport) + (mapped(saddr) if saddr else b"\x00" * 16)


def option(code, data=b""):
    pad = (4 - len(data) % 4) % 4
    return struct.pack("!BBH", code, 0, len(data)) + data + b"\x00" * pad


def filter_opt(addr, v4len, port=0):
    """Figure 15: FILTER (prefix length counts the 96 bits of ::ffff:0:0/96)."""
    return option(3, struct.pack("!BBH", 0, 96 + v4len, port) + mapped(addr))


def map_req(client, lifetime, proto, iport, sport=0, saddr=None, opts=b"", nonce=NONCE):
    return header(1, lifetime, client) + map_body(proto, iport, sport, saddr, nonce) + opts


def peer_req(client, lifetime, proto, iport, remote, rport, nonce=NONCE, sport=0, saddr=None, opts=b""):
    """Figure 10: PEER opcode data (`sport`, `saddr`: the suggested external endpoint)."""
    return (header(2, lifetime, client) + map_body(proto, iport, sport, saddr, nonce=nonce)
            + struct.pack("!HH", rport, 0) + mapped(remote) + opts)


def pcp_frame(sub, payload, sport=CPORT):
    return h.eth_in(sub) / IP(src=sub, dst=h.INSIDE_ADDR) / UDP(sport=sport, dport=PCP_PORT) / Raw(payload)


def pcp_config(nat=None, extra=""):
    return h.make_config(nat=nat) + "[pcp]\nenabled = true\nmax_lifetime = \"2h\"\n" + extra


def run(tmp_path, cfg, frames):
    proc, d = h.run_replay_files(cfg, frames, tmp_path)
    assert proc.returncode == 0, h.proc_text(proc)
    outs = h.decode_outputs(h.check_output_capture(d / "out.pcapng"))
    report = json.loads((d / "r.json").read_text())
    p = report["packets"]
    assert p["in"] == p["out"] - p["generated"] + p["dropped"], p
    return outs, report, d


def answers(outs):
    """natrix's PCP answers: UDP from the inside address's port 5351, leaving inside."""
    return [o for o in outs if o.side == "inside" and h.is_udp(o.pkt) and o.pkt[UDP].sport == PCP_PORT]


def tshark_pcp(path):
    """Every PCP message tshark finds in `path`, as a dict of portcontrol fields."""
    fields = ["frame.interface_name", "ip.src", "ip.dst", "udp.srcport", "udp.dstport",
              "portcontrol.version", "portcontrol.r", "portcontrol.opcode", "portcontrol.result_code",
              "portcontrol.lifetime_rsp", "portcontrol.epoch_time", "portcontrol.map.nonce",
              "portcontrol.map.protocol", "portcontrol.map.internal_port",
              "portcontrol.map.rsp_assigned_external_port", "portcontrol.map.rsp_assigned_ext_ip",
              "portcontrol.peer.nonce", "portcontrol.peer.rsp_assigned_external_port",
              "portcontrol.peer.rsp_assigned_ext_ip", "portcontrol.peer.remote_peer_port",
              "portcontrol.peer.remote_peer_ip", "portcontrol.option.code", "_ws.malformed", "_ws.expert"]
    cmd = [TSHARK, "-r", str(path), "-Y", "portcontrol", "-T", "fields", "-E", "separator=\t", "-E", "occurrence=a",
           "-E", "aggregator=,"]
    for f in fields:
        cmd += ["-e", f]
    env = dict(os.environ, HOME=os.environ.get("HOME", "/tmp"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = []
    for line in proc.stdout.splitlines():
        vals = line.split("\t")
        rows.append(dict(zip(fields, vals + [""] * (len(fields) - len(vals)))))
    return rows


def tshark_answers(d):
    """natrix's answers as tshark decodes them, in order. An error answer
    copies its request (section 8.3), so it may be malformed only where
    tshark finds the request itself malformed."""
    requests = [r for r in tshark_pcp(d / "in.pcapng") if r["udp.dstport"] == str(PCP_PORT)]
    bad_request = any(r["_ws.malformed"] for r in requests)
    rows = [r for r in tshark_pcp(d / "out.pcapng") if r["udp.srcport"] == str(PCP_PORT)]
    for r in rows:
        assert bad_request or r["_ws.malformed"] == "", f"tshark finds a malformed PCP answer: {r}"
        assert r["frame.interface_name"] == "inside", r
        assert r["ip.src"] == h.INSIDE_ADDR, r
        assert r["portcontrol.r"] in ("1", "True"), r
        assert r["portcontrol.version"] == "2", r
    return rows


def result_of(row):
    return int(row["portcontrol.result_code"], 0)


@needs_tshark
def test_map_round_trip_decoded_by_tshark_then_an_outside_host_reaches_the_subscriber(tmp_path):
    cfg = pcp_config()
    req = pcp_frame(SUB_A, map_req(SUB_A, 3600, 17, 5000))
    outs, report, d = run(tmp_path, cfg, [(T0, "inside", req)])
    (ans,) = answers(outs)
    assert (ans.pkt[IP].dst, ans.pkt[UDP].dport) == (SUB_A, CPORT)
    assert (ans.pkt.src, ans.pkt.dst) == (h.NAT_IN_MAC, h.mac_for(SUB_A)), "Ethernet addresses swapped"
    assert report["packets"]["generated"] == 1
    assert report["drops"].get("local_destination") == 1
    (row,) = tshark_answers(d)
    assert int(row["portcontrol.opcode"], 0) == 1
    assert result_of(row) == SUCCESS
    assert int(row["portcontrol.lifetime_rsp"]) == 3600
    assert int(row["portcontrol.epoch_time"]) == 0
    assert row["portcontrol.map.nonce"].replace(":", "") == NONCE.hex()
    assert int(row["portcontrol.map.protocol"]) == 17 and int(row["portcontrol.map.internal_port"]) == 5000
    assert row["portcontrol.map.rsp_assigned_ext_ip"] == "::ffff:" + POOL1
    ext_port = int(row["portcontrol.map.rsp_assigned_external_port"])
    assert ext_port == 5000, "port preserved"
    # An outside host sends to the assigned endpoint: it reaches the subscriber.
    inbound = h.udp_in(SRV1, 7777, POOL1, ext_port, payload=b"knock")
    outs, report, _ = run(tmp_path, cfg, [(T0, "inside", req), (T0 + 1, "outside", inbound)])
    hit = h.one(outs, "inside", h.has_payload(b"knock"), "inbound datagram")
    assert (hit.pkt[IP].dst, hit.pkt[UDP].dport, hit.pkt[IP].src) == (SUB_A, 5000, SRV1)


def test_pcp_mapping_is_logged_and_outlives_idle_timeout(tmp_path):
    log = tmp_path / "events.jsonl"
    cfg = pcp_config(extra=f"[logging]\njson = {json.dumps(str(log))}\n")
    frames = [(T0, "inside", pcp_frame(SUB_A, map_req(SUB_A, 1000, 17, 5000))),
              # 700 s later: more than two UDP timeouts without a packet.
              (T0 + 700, "outside", h.udp_in(SRV1, 7777, POOL1, 5000, payload=b"late")),
              # After the lifetime (and the inbound session's own 5 minutes).
              (T0 + 1400, "outside", h.udp_in(SRV2, 7777, POOL1, 5000, payload=b"too-late"))]
    outs, report, _ = run(tmp_path, cfg, frames)
    h.one(outs, "inside", h.has_payload(b"late"), "datagram within the PCP lifetime")
    h.none_of(outs, "inside", h.has_payload(b"too-late"), "datagram after the mapping ended")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    created = [r for r in records if r["nat_event"] == 8]
    deleted = [r for r in records if r["nat_event"] == 9]
    assert [(r["subscriber"], r["subscriber_port"], r["external_port"]) for r in created] == [(SUB_A, 5000, 5000)]
    assert len(deleted) == 1 and deleted[0]["external_port"] == 5000
    assert report["mappings_created"] == 1


@needs_tshark
@pytest.mark.parametrize("name,payload,code", [
    ("version 1", header(1, 3600, SUB_A, version=1) + map_body(17, 5000), UNSUPP_VERSION),
    ("MAP data cut short", map_req(SUB_A, 3600, 17, 5000)[:44], MALFORMED_REQUEST),
    ("not a multiple of 4", map_req(SUB_A, 3600, 17, 5000) + b"\x00", MALFORMED_REQUEST),
    ("opcode 9", header(9, 3600, SUB_A) + map_body(17, 5000), UNSUPP_OPCODE),
    ("client address of another host", map_req(SUB_B, 3600, 17, 5000), ADDRESS_MISMATCH),
    ("unknown mandatory option", map_req(SUB_A, 3600, 17, 5000, opts=option(99, b"\x01")), UNSUPP_OPTION),
    ("THIRD_PARTY", map_req(SUB_A, 3600, 17, 5000, opts=option(1, mapped(SUB_B))), UNSUPP_OPTION),
    ("FILTER of the wrong length", map_req(SUB_A, 3600, 17, 5000, opts=option(3, b"\x00" * 8)), MALFORMED_OPTION),
    ("PREFER_FAILURE twice", map_req(SUB_A, 3600, 17, 5000, 5000, opts=option(2) + option(2)), MALFORMED_OPTION),
    ("SCTP", map_req(SUB_A, 3600, 132, 5000), UNSUPP_PROTOCOL),
    # Section 11.1: "all ports" is legal; natrix's policy does not grant it.
    ("internal port 0", map_req(SUB_A, 3600, 17, 0), NOT_AUTHORIZED),
    # Section 12.1: PREFER_FAILURE "MUST" make a PEER request MALFORMED_REQUEST.
    ("PEER with PREFER_FAILURE", peer_req(SUB_A, 3600, 17, 5000, SRV1, 53, opts=option(2)), MALFORMED_REQUEST),
])
def test_error_codes_decoded_by_tshark(tmp_path, name, payload, code):
    outs, report, d = run(tmp_path, pcp_config(), [(T0, "inside", pcp_frame(SUB_A, payload))])
    (ans,) = answers(outs)
    raw = h.l4_data(ans.pkt)
    assert raw[3] == code, f"{name}: result {raw[3]}"
    assert raw[0] == 2 and raw[1] & 0x80, name
    assert len(raw) % 4 == 0 and 24 <= len(raw) <= 1100
    assert struct.unpack("!I", raw[4:8])[0] == 1800, "long-lifetime error"
    if code != UNSUPP_VERSION and len(payload) >= 24:
        # Error answers copy the request past the header.
        n = min(len(payload), 1100)
        assert raw[24:n] == payload[24:n]
    # Section 7.2: the reserved 96 bits are zero, but for a request that
    # did not parse they carry the last 96 bits of its client address field.
    unparsed = code in (UNSUPP_VERSION, MALFORMED_REQUEST, UNSUPP_OPCODE, MALFORMED_OPTION)
    assert raw[12:24] == (payload[12:24] if unparsed else b"\x00" * 12), f"{name}: reserved {raw[12:24].hex()}"
    (row,) = tshark_answers(d)
    assert result_of(row) == code, row
    assert report["mappings_created"] == 0


@needs_tshark
def test_nonce_prefer_failure_and_quota(tmp_path):
    frames = [
        (T0, "inside", pcp_frame(SUB_A, map_req(SUB_A, 3600, 17, 5000))),
        # Another nonce for the same mapping.
        (T0 + 1, "inside", pcp_frame(SUB_A, map_req(SUB_A, 3600, 17, 5000, nonce=b"other-nonce!"))),
        # SUB_B asks for the port SUB_A holds, with and without PREFER_FAILURE.
        (T0 + 2, "inside", pcp_frame(SUB_B, map_req(SUB_B, 3600, 17, 6000, 5000, POOL1, opts=option(2)))),
        (T0 + 3, "inside", pcp_frame(SUB_B, map_req(SUB_B, 3600, 17, 6000, 5000, POOL1))),
        # SUB_B's second mapping is over its quota of 1.
        (T0 + 4, "inside", pcp_frame(SUB_B, map_req(SUB_B, 3600, 17, 6001))),
        # A free suggested port is honoured.
        (T0 + 5, "inside", pcp_frame(SUB_A, map_req(SUB_A, 3600, 6, 22, 2222, POOL1, opts=option(2)))),
    ]
    outs, report, d = run(tmp_path, pcp_config(nat={"max_ports_per_subscriber": 2, "max_ports_per_protocol": {"udp": 1}}), frames)
    rows = tshark_answers(d)
    assert [result_of(r) for r in rows] == [SUCCESS, NOT_AUTHORIZED, CANNOT_PROVIDE_EXTERNAL, SUCCESS, USER_EX_QUOTA, SUCCESS]
    assert int(rows[3]["portcontrol.map.rsp_assigned_external_port"]) != 5000
    assert int(rows[4]["portcontrol.lifetime_rsp"]) == 30, "short-lifetime error"
    assert int(rows[5]["portcontrol.map.rsp_assigned_external_port"]) == 2222
    assert "2" in rows[5]["portcontrol.option.code"].split(","), "PREFER_FAILURE echoed"
    assert report["mappings_created"] == 3


@needs_tshark
def test_filter_and_peer(tmp_path):
    frames = [
        (T0, "inside", pcp_frame(SUB_A, map_req(SUB_A, 3600, 17, 5000, opts=filter_opt(SRV1, 32)))),
        (T0 + 1, "outside", h.udp_in(SRV1, 1000, POOL1, 5000, payload=b"allowed")),
        (T0 + 1, "outside", h.udp_in(SRV2, 1000, POOL1, 5000, payload=b"filtered")),
        (T0 + 2, "inside", pcp_frame(SUB_B, peer_req(SUB_B, 1000, 17, 6000, SRV2, 53))),
        # The PEER session is still there 800 s later, with no traffic.
        (T0 + 800, "outside", h.udp_in(SRV2, 53, POOL1, 6000, payload=b"peer-late")),
    ]
    outs, report, d = run(tmp_path, pcp_config(nat={"filtering": "address-and-port-dependent"}), frames)
    h.one(outs, "inside", h.has_payload(b"allowed"), "datagram from the FILTER's peer")
    h.none_of(outs, "inside", h.has_payload(b"filtered"), "datagram from another peer")
    h.one(outs, "inside", h.has_payload(b"peer-late"), "datagram of the PEER session")
    assert report["drops"].get("filtered") == 1
    rows = tshark_answers(d)
    assert [result_of(r) for r in rows] == [SUCCESS, SUCCESS]
    assert "3" in rows[0]["portcontrol.option.code"].split(","), "FILTER echoed"
    peer = rows[1]
    assert int(peer["portcontrol.opcode"], 0) == 2
    assert peer["portcontrol.peer.nonce"].replace(":", "") == NONCE.hex()
    assert peer["portcontrol.peer.remote_peer_ip"] == "::ffff:" + SRV2
    assert int(peer["portcontrol.peer.remote_peer_port"]) == 53
    assert peer["portcontrol.peer.rsp_assigned_ext_ip"] == "::ffff:" + POOL1


@needs_tshark
def test_peer_honours_its_suggested_external_endpoint_or_refuses(tmp_path):
    """Section 12.1: a PEER request with a non-zero suggested external
    address or port that the server cannot honour MUST get
    CANNOT_PROVIDE_EXTERNAL (PREFER_FAILURE's semantics are implied), as
    when a client re-creates a connection's mapping after the server lost
    it; a free suggested port is given."""
    frames = [
        (T0, "inside", pcp_frame(SUB_A, map_req(SUB_A, 3600, 17, 5000))),
        # SUB_B re-creates a connection whose external port SUB_A now holds.
        (T0 + 1, "inside", pcp_frame(SUB_B, peer_req(SUB_B, 3600, 17, 6000, SRV1, 53, sport=5000, saddr=POOL1))),
        (T0 + 2, "inside", pcp_frame(SUB_B, peer_req(SUB_B, 3600, 17, 6000, SRV1, 53, sport=7000, saddr=POOL1))),
        # The same PEER again, now suggesting another port than its own.
        (T0 + 3, "inside", pcp_frame(SUB_B, peer_req(SUB_B, 3600, 17, 6000, SRV1, 53, sport=7001, saddr=POOL1))),
    ]
    outs, report, d = run(tmp_path, pcp_config(), frames)
    rows = tshark_answers(d)
    assert [result_of(r) for r in rows] == [SUCCESS, CANNOT_PROVIDE_EXTERNAL, SUCCESS, CANNOT_PROVIDE_EXTERNAL], rows
    assert int(rows[2]["portcontrol.peer.rsp_assigned_external_port"]) == 7000
    assert report["mappings_created"] == 2, "the refused request left no mapping"


def test_a_filter_of_prefix_length_zero_means_no_filter_whatever_its_port(tmp_path):
    """Section 13.3: prefix length 0 "indicates 'no filter', and will
    remove all previous filters": with address-and-port-dependent
    filtering, a MAP with a FILTER for one peer, then a refresh with
    that FILTER followed by one of prefix length 0 and port 53, admits a
    peer from any port."""
    zero = option(3, struct.pack("!BBH", 0, 0, 53) + b"\x00" * 16)
    frames = [
        (T0, "inside", pcp_frame(SUB_A, map_req(SUB_A, 3600, 17, 5000, opts=filter_opt(SRV1, 32)))),
        (T0 + 1, "inside", pcp_frame(SUB_A, map_req(SUB_A, 3600, 17, 5000, opts=filter_opt(SRV1, 32) + zero))),
        (T0 + 2, "outside", h.udp_in(SRV2, 1000, POOL1, 5000, payload=b"any-peer-any-port")),
    ]
    outs, report, _ = run(tmp_path, pcp_config(nat={"filtering": "address-and-port-dependent"}), frames)
    assert [h.l4_data(a.pkt)[3] for a in answers(outs)] == [SUCCESS, SUCCESS]
    h.one(outs, "inside", h.has_payload(b"any-peer-any-port"), "datagram once the filters are removed")


@needs_tshark
def test_announce_and_epoch(tmp_path):
    frames = [(T0, "inside", pcp_frame(SUB_A, header(0, 0, SUB_A))),
              (T0 + 42, "inside", pcp_frame(SUB_A, header(0, 0, SUB_A)))]
    outs, report, d = run(tmp_path, pcp_config(), frames)
    rows = tshark_answers(d)
    assert [(int(r["portcontrol.opcode"], 0), result_of(r)) for r in rows] == [(0, SUCCESS), (0, SUCCESS)]
    assert [int(r["portcontrol.epoch_time"]) for r in rows] == [0, 42]


def test_disabled_server_stays_silent(tmp_path):
    outs, report, _ = run(tmp_path, h.make_config(), [(T0, "inside", pcp_frame(SUB_A, map_req(SUB_A, 3600, 17, 5000)))])
    assert not answers(outs)
    assert report["packets"]["generated"] == 0
    assert report["drops"] == {"local_destination": 1}


@needs_tshark
def test_garbage_never_crashes_and_every_answer_is_well_formed(tmp_path):
    rnd = random.Random(6887)
    frames = []
    for i in range(300):
        kind = rnd.randrange(4)
        if kind == 0:
            payload = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 120)))
        else:
            payload = bytearray(map_req(SUB_A, rnd.choice([0, 60, 3600, 2**32 - 1]), rnd.choice([0, 6, 17, 1]),
                                        rnd.randrange(65536), rnd.randrange(65536), rnd.choice([None, POOL1, SRV1])))
            if kind == 2:
                payload[1] = rnd.randrange(256)
            if kind == 3:
                payload += bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 40)))
            payload = bytes(payload)
        frames.append((T0 + i * 0.01, "inside", pcp_frame(SUB_A, payload, sport=1024 + i)))
    outs, report, d = run(tmp_path, pcp_config(), frames)
    for o in answers(outs):
        raw = h.l4_data(o.pkt)
        assert len(raw) % 4 == 0 and 24 <= len(raw) <= 1100 and raw[0] == 2 and raw[1] & 0x80 and raw[3] <= 13
    tshark_answers(d)
