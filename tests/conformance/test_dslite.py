"""DS-Lite AFTR (RFC 6333) in replay, judged by scapy (CONTRACTS.md "DS-Lite
AFTR (RFC 6333)").

Softwire frames are built with scapy: Ethernet / IPv6 (B4 -> AFTR, next
header 4) / the host's IPv4 packet (RFC 2473 section 3). Every output frame
is decoded by scapy; the IPv4 packets, bare or inside a softwire, have their
header and transport checksums recomputed independently
(natrix_harness.verify_ipv4_checksums); outer fragments are reassembled by
scapy's defragment6.
"""

import json
import struct

from scapy.layers.inet import ICMP, IP, TCP, UDP, fragment
from scapy.layers.inet6 import ICMPv6PacketTooBig, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, defragment6, fragment6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

import natrix_harness as h

T0 = h.T0
AFTR = "2001:db8:0:1::1"
B4_1, B4_2 = "2001:db8:100::2", "2001:db8:100::3"
HOST = "192.0.0.2"            # RFC 6333's B4 address range 192.0.0.0/29
AFTR_V4 = "192.0.0.1"          # RFC 6333 section 5.7
SERVER = "198.51.100.20"
POOL = h.POOL1
ROUTER6 = "2001:db8:0:2::fe"   # a router between the AFTR and the B4s
B4_MAC = "02:00:00:00:0b:04"


def config(extra_nat="", dslite=""):
    return f'[nat]\npool = ["{POOL}/32"]\n{extra_nat}[dslite]\naftr = "{AFTR}"\n{dslite}'


def softwire(b4, inner, hlim=64):
    """A softwire packet from `b4` carrying the IPv4 packet `inner`."""
    return Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / IPv6(src=b4, dst=AFTR, nh=4, hlim=hlim) / inner


def replay(replay_files, cfg, frames):
    """Runs natrix replay; returns ([(side, Ether)], report)."""
    proc, d = replay_files(cfg, frames)
    assert proc.returncode == 0, f"natrix replay exited {proc.returncode}\n{h.proc_text(proc)}"
    recs = h.check_output_capture(d / "out.pcapng")
    outs = []
    for i, (_ts, side, raw) in enumerate(recs):
        pkt = Ether(raw)
        if IPv6 in pkt:
            check_softwire_frame(pkt, f"output #{i}")
        else:
            h.verify_ipv4_checksums(bytes(pkt[IP]), f"output #{i}")
        outs.append((side, pkt))
    return outs, json.loads((d / "r.json").read_text())


def check_softwire_frame(pkt, where):
    """Contract: Ethernet / IPv6 (source aftr, hop limit 64, next header 4 or
    a fragment header whose next header is 4)."""
    ip6 = pkt[IPv6]
    assert ip6.src == AFTR, f"{where}: outer source {ip6.src}, expected the AFTR {AFTR}"
    assert ip6.hlim == 64, f"{where}: outer hop limit {ip6.hlim}, expected 64"
    if IPv6ExtHdrFragment in pkt:
        assert pkt[IPv6ExtHdrFragment].nh == 4, f"{where}: fragment of something else than IPv4 in IPv6"
    else:
        assert ip6.nh == 4, f"{where}: next header {ip6.nh}, expected 4"
        assert ip6.plen == len(bytes(ip6.payload)), f"{where}: payload length {ip6.plen} disagrees with the packet"
        h.verify_ipv4_checksums(bytes(ip6.payload), f"{where} (inner)")


def inner_of(pkt):
    """The IPv4 packet a softwire frame carries, decoded by scapy."""
    return IP(bytes(pkt[IPv6].payload))


def outside(outs):
    return [p for s, p in outs if s == "outside"]


def to_b4(outs, b4=None):
    return [p for s, p in outs if s == "inside" and IPv6 in p and (b4 is None or p[IPv6].dst == b4)]


def show(outs):
    return "\n".join(f"  {s:7s} {p.summary()}" for s, p in outs) or "  (no output)"


def udp_from_host(b4, sport=5000, dport=53, payload=b"query", host=HOST, ttl=64, flags=0):
    return softwire(b4, IP(src=host, dst=SERVER, ttl=ttl, flags=flags) / UDP(sport=sport, dport=dport) / Raw(payload))


def udp_reply(ext_port, sport=53, payload=b"answer", flags=0, size=None):
    p = IP(src=SERVER, dst=POOL, ttl=64, flags=flags) / UDP(sport=sport, dport=ext_port)
    body = payload if size is None else bytes(size - 28)
    return h.eth_out() / p / Raw(body)


def test_two_b4s_with_one_inner_endpoint_get_two_mappings_and_replies_find_their_b4(replay_files):
    frames = [(T0, "inside", udp_from_host(B4_1)), (T0 + 0.1, "inside", udp_from_host(B4_2))]
    outs, _ = replay(replay_files, config(), frames)
    sent = outside(outs)
    assert len(sent) == 2, show(outs)
    for p in sent:
        assert (p[IP].src, p[IP].dst, p[UDP].dport) == (POOL, SERVER, 53), p.summary()
        assert p[IP].ttl == 63, "TTL decremented once"
    ports = [p[UDP].sport for p in sent]
    assert ports[0] != ports[1], f"two homes share one external endpoint: {ports}"
    frames += [(T0 + 1, "outside", udp_reply(ports[1], payload=b"for-two")), (T0 + 1.1, "outside", udp_reply(ports[0], payload=b"for-one"))]
    outs, rep = replay(replay_files, config(), frames)
    back = to_b4(outs)
    assert [p[IPv6].dst for p in back] == [B4_2, B4_1], show(outs)
    for p, payload in zip(back, [b"for-two", b"for-one"]):
        i = inner_of(p)
        assert (i.src, i.dst, i[UDP].sport, i[UDP].dport) == (SERVER, HOST, 53, 5000), i.summary()
        assert i.ttl == 63, "inner TTL decremented once"
        assert bytes(i[UDP].payload) == payload
        assert p[IPv6].plen == i.len
    assert rep["packets"]["dropped"] == 0, rep["drops"]


def test_plain_ipv4_subscribers_keep_working_beside_softwires(replay_files):
    frames = [(T0, "inside", udp_from_host(B4_1)), (T0 + 0.1, "inside", h.udp_out(h.SUB_A, 5000, SERVER, 53))]
    outs, _ = replay(replay_files, config(), frames)
    sent = outside(outs)
    assert len(sent) == 2, show(outs)
    ports = [p[UDP].sport for p in sent]
    frames.append((T0 + 1, "outside", udp_reply(ports[1])))
    outs, _ = replay(replay_files, config(), frames)
    plain = [p for s, p in outs if s == "inside"]
    assert len(plain) == 1 and IPv6 not in plain[0] and plain[0][IP].dst == h.SUB_A, show(outs)


def test_any_inner_source_is_accepted_and_events_carry_the_b4(replay_files, tmp_path):
    log = tmp_path / "events.jsonl"
    cfg = config(dslite="") + f'[logging]\njson = "{log}"\n'
    frames = [(T0, "inside", udp_from_host(B4_1, host="10.1.2.3")), (T0 + 0.1, "inside", udp_from_host(B4_2, host=HOST))]
    outs, _ = replay(replay_files, cfg, frames)
    assert len(outside(outs)) == 2, show(outs)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    created = [(e["subscriber"], e.get("b4"), e["subscriber_port"]) for e in events if e["event"] == "mapping_create"]
    assert created == [("10.1.2.3", B4_1, 5000), (HOST, B4_2, 5000)], events


def test_quota_holds_per_b4_and_the_refusal_goes_back_through_the_softwire(replay_files):
    cfg = config(extra_nat="max_ports_per_subscriber = 2\n")
    frames = [(T0 + k * 0.1, "inside", udp_from_host(B4_1, sport=5000 + k)) for k in range(3)]
    frames.append((T0 + 1, "inside", udp_from_host(B4_2, sport=5000)))
    outs, rep = replay(replay_files, cfg, frames)
    sent = outside(outs)
    assert len(sent) == 3, show(outs)
    assert rep["drops"].get("port_quota") == 1, rep["drops"]
    errors = to_b4(outs, B4_1)
    assert len(errors) == 1, show(outs)
    i = inner_of(errors[0])
    assert (i.src, i.dst) == (AFTR_V4, HOST), i.summary()
    assert (i[ICMP].type, i[ICMP].code) == (3, 1), "RFC 6888 REQ-11 default: host unreachable"
    quoted = IP(bytes(i[ICMP].payload))
    assert (quoted.src, quoted.dst, quoted[UDP].sport) == (HOST, SERVER, 5002), "the error quotes the packet as the host sent it"
    assert not to_b4(outs, B4_2), "the other B4 is not refused"


def test_one_b4_making_up_inner_addresses_leaves_stand_ins_for_the_others(replay_files):
    """A B4 has no more hosts with a stand-in than it may hold ports: one
    that sends from made-up inner addresses is refused past its quota, and
    the stand-in table (`max_sessions` pairs) keeps room for other B4s'
    hosts. Without the per-B4 bound, the refused hosts' stand-ins would fill
    the table until their grace period ends, refusing everyone."""
    cfg = config(extra_nat="max_ports_per_subscriber = 2\nmax_sessions = 8\n")
    frames = [(T0 + k * 0.01, "inside", udp_from_host(B4_1, host=f"10.0.0.{k + 1}")) for k in range(12)]
    frames.append((T0 + 0.5, "inside", udp_from_host(B4_2)))
    outs, rep = replay(replay_files, cfg, frames)
    sent = outside(outs)
    assert len(sent) == 3, show(outs)
    # Hosts 1 and 2 hold a port each; hosts 3-12 are past the B4's two hosts.
    assert rep["drops"] == {"dslite_b4_hosts": 10}, rep["drops"]
    assert not to_b4(outs, B4_1), "refused without an answer: the refused host has no stand-in to answer through"
    assert not to_b4(outs, B4_2), "the other B4's host is translated, not refused"


def test_ttl_expiry_is_answered_through_the_softwire_from_192_0_0_1(replay_files):
    outs, rep = replay(replay_files, config(), [(T0, "inside", udp_from_host(B4_1, ttl=1))])
    assert not outside(outs)
    errors = to_b4(outs, B4_1)
    assert len(errors) == 1, show(outs)
    i = inner_of(errors[0])
    assert (i.src, i.dst, i[ICMP].type, i[ICMP].code) == (AFTR_V4, HOST, 11, 0), i.summary()
    assert rep["drops"] == {"ttl_expired": 1}


def mss_of(tcp):
    return dict((k, v) for k, v in tcp.options).get("MSS")


def test_mss_is_clamped_both_ways_for_softwires_only(replay_files):
    syn = softwire(B4_1, IP(src=HOST, dst=SERVER) / TCP(sport=40000, dport=80, flags="S", seq=1, options=[("MSS", 1460), ("SAckOK", b"")]))
    plain = h.eth_in(h.SUB_A) / IP(src=h.SUB_A, dst=SERVER) / TCP(sport=40001, dport=80, flags="S", seq=1, options=[("MSS", 1460)])
    frames = [(T0, "inside", syn), (T0 + 0.1, "inside", plain)]
    outs, _ = replay(replay_files, config(), frames)
    sent = outside(outs)
    assert [mss_of(p[TCP]) for p in sent] == [1420, 1460], "mss_clamp = 0 means mtu - 80; plain IPv4 is not clamped"
    ext = sent[0][TCP].sport
    synack = h.eth_out() / IP(src=SERVER, dst=POOL) / TCP(sport=80, dport=ext, flags="SA", seq=9, ack=2, options=[("MSS", 1460)])
    frames.append((T0 + 1, "outside", synack))
    outs, _ = replay(replay_files, config(), frames)
    back = to_b4(outs, B4_1)
    assert len(back) == 1, show(outs)
    assert mss_of(inner_of(back[0])[TCP]) == 1420
    outs, _ = replay(replay_files, config(dslite="mss_clamp = 1300\n"), frames)
    assert mss_of(outside(outs)[0][TCP]) == 1300
    outs, _ = replay(replay_files, config(dslite='mss_clamp = "off"\n'), frames)
    assert mss_of(outside(outs)[0][TCP]) == 1460


def mapped_port(replay_files, cfg, frames):
    outs, _ = replay(replay_files, cfg, frames)
    return outside(outs)[0][UDP].sport


def test_a_df_packet_too_big_for_the_softwire_gets_fragmentation_needed_with_mtu_minus_40(replay_files):
    frames = [(T0, "inside", udp_from_host(B4_1))]
    port = mapped_port(replay_files, config(), frames)
    big = udp_reply(port, flags="DF", size=1480)
    frames.append((T0 + 1, "outside", big))
    outs, rep = replay(replay_files, config(), frames)
    assert not to_b4(outs), show(outs)
    errs = [p for s, p in outs if s == "outside" and ICMP in p]
    assert len(errs) == 1, show(outs)
    e = errs[0]
    assert (e[IP].dst, e[ICMP].type, e[ICMP].code, e[ICMP].nexthopmtu) == (SERVER, 3, 4, 1460), e.summary()
    quoted = IP(bytes(e[ICMP].payload))
    assert (quoted.dst, quoted[UDP].dport) == (POOL, port), "quoted as the server sent it"
    assert len(bytes(e[ICMP].payload)) == 128, "REPLAY-CONTRACT: the first 128 bytes of the packet"
    assert rep["drops"] == {"fragmentation_needed": 1}


def test_without_df_the_outer_packet_is_fragmented_towards_the_b4(replay_files):
    frames = [(T0, "inside", udp_from_host(B4_1))]
    port = mapped_port(replay_files, config(), frames)
    frames.append((T0 + 1, "outside", udp_reply(port, size=1480)))
    outs, rep = replay(replay_files, config(), frames)
    frags = to_b4(outs, B4_1)
    assert len(frags) == 2 and all(IPv6ExtHdrFragment in p for p in frags), show(outs)
    assert all(len(bytes(p[IPv6])) <= 1500 for p in frags), "each fragment fits the softwire MTU"
    whole = defragment6([p[IPv6] for p in frags])
    i = IP(bytes(whole[IPv6].payload))
    h.verify_ipv4_checksums(bytes(i), "reassembled inner packet")
    assert (i.dst, i[UDP].dport, i.len) == (HOST, 5000, 1480)
    assert rep["dslite"] == {"softwires": 1, "decapsulated": 1, "encapsulated": 1, "outer_fragments": 2, "reassembled": 0, "mtu_lowered": 0,
                            "ecn_unexpected": 0}


def test_fragmented_softwire_packets_from_a_b4_are_reassembled(replay_files):
    inner = IP(src=HOST, dst=SERVER, id=7) / UDP(sport=5000, dport=53) / Raw(bytes(range(256)) * 6)
    pkt = IPv6(src=B4_1, dst=AFTR) / IPv6ExtHdrFragment(id=0x1234, nh=4) / inner
    frags = fragment6(pkt, 1000)
    assert len(frags) >= 2
    frames = [(T0 + k * 0.01, "inside", Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / f) for k, f in enumerate(reversed(frags))]
    outs, rep = replay(replay_files, config(), frames)
    sent = outside(outs)
    assert len(sent) == 1, show(outs)
    assert bytes(sent[0][UDP].payload) == bytes(range(256)) * 6
    assert (sent[0][IP].src, sent[0][UDP].dport) == (POOL, 53)
    assert rep["packets"]["dropped"] == 0, rep["drops"]
    assert (rep["dslite"]["reassembled"], rep["dslite"]["decapsulated"]) == (1, 1)


def test_packet_too_big_lowers_the_mtu_towards_that_b4_only(replay_files):
    frames = [(T0, "inside", udp_from_host(B4_1)), (T0 + 0.1, "inside", udp_from_host(B4_2))]
    outs, _ = replay(replay_files, config(), frames)
    p1, p2 = [p[UDP].sport for p in outside(outs)]
    quoted = IPv6(src=AFTR, dst=B4_1, nh=4, hlim=63) / IP(src=SERVER, dst=HOST) / UDP(sport=53, dport=5000) / Raw(bytes(1300))
    ptb = Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / IPv6(src=ROUTER6, dst=AFTR) / ICMPv6PacketTooBig(mtu=1280) / Raw(bytes(quoted)[:1232])
    frames += [(T0 + 1, "inside", ptb), (T0 + 2, "outside", udp_reply(p1, flags="DF", size=1300)), (T0 + 2.1, "outside", udp_reply(p2, flags="DF", size=1300))]
    outs, rep = replay(replay_files, config(), frames)
    errs = [p for s, p in outs if s == "outside" and ICMP in p]
    assert len(errs) == 1 and errs[0][ICMP].nexthopmtu == 1240, show(outs)
    assert len(to_b4(outs, B4_2)) == 1, "B4 2 keeps the configured MTU"
    assert not to_b4(outs, B4_1)
    assert rep["dslite"]["mtu_lowered"] == 1


def test_bad_softwires_are_dropped_by_reason(replay_files):
    cfg = config(dslite='b4_prefixes = ["2001:db8:100::/48"]\n')
    inner = IP(src=HOST, dst=SERVER) / UDP(sport=5000, dport=53)
    wrong_aftr = Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / IPv6(src=B4_1, dst="2001:db8:0:1::99", nh=4) / inner
    foreign_b4 = softwire("2001:db8:200::2", inner)
    not_ipv4 = softwire(B4_1, IPv6(src="2001:db8::1", dst="2001:db8::2") / UDP())
    truncated = Ether(bytes(softwire(B4_1, inner))[:14 + 40 + 12])
    lying = Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / IPv6(src=B4_1, dst=AFTR, nh=4, plen=400) / inner
    opts = IPv6ExtHdrDestOpt(nh=60)
    endless = Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / IPv6(src=B4_1, dst=AFTR, nh=60) / (opts / opts / opts / opts / opts / opts / opts / opts / opts / IPv6ExtHdrDestOpt(nh=4)) / inner
    udp_to_aftr = Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / IPv6(src=B4_1, dst=AFTR) / UDP(sport=1, dport=2)
    frames = [(T0 + k * 0.1, "inside", f) for k, f in enumerate([wrong_aftr, foreign_b4, not_ipv4, truncated, lying, endless, udp_to_aftr])]
    outs, rep = replay(replay_files, cfg, frames)
    assert not outs, show(outs)
    assert rep["drops"] == {"dslite_wrong_aftr": 1, "dslite_b4_refused": 1, "ipv4_bad_version": 1, "ipv6_truncated": 2, "ipv6_bad_header": 1,
                            "local_destination": 1}, rep["drops"]


def test_replay_is_deterministic(replay_files):
    frames = [(T0 + k * 0.1, "inside", udp_from_host(B4_1 if k % 2 else B4_2, sport=6000 + k)) for k in range(6)]
    a, _ = replay(replay_files, config(), frames)
    b, _ = replay(replay_files, config(), frames)
    assert [bytes(p) for _, p in a] == [bytes(p) for _, p in b]


def test_ipfix_records_of_softwire_hosts_carry_the_b4_as_source_ipv6_address(natrix_bin, tmp_path):
    """Contract: IPFIX records carry sourceIPv6Address (IE 27) in their own
    templates; decoded by tshark's cflow dissector."""
    from test_ipfix import check_stream, export
    capture = tmp_path / "in.pcapng"
    h.write_pcapng(capture, [(T0, "inside", udp_from_host(B4_1)), (T0 + 0.1, "inside", h.udp_out(h.SUB_A, 5000, SERVER, 53))])
    _records, messages = export(natrix_bin, tmp_path, config(), capture)
    check_stream(messages)
    data = [rec for m in messages for _set, rec in m["data"]]
    assert len(data) == 2, data
    softwire_rec = [r for r in data if "cflow.srcaddrv6" in r]
    plain_rec = [r for r in data if "cflow.srcaddrv6" not in r]
    assert len(softwire_rec) == 1 and len(plain_rec) == 1, data
    assert softwire_rec[0]["cflow.srcaddrv6"] == B4_1
    assert softwire_rec[0]["cflow.srcaddr"] == HOST
    assert plain_rec[0]["cflow.srcaddr"] == h.SUB_A


def test_whois_names_the_b4_and_the_inner_address_and_port(replay_files, natrix, tmp_path):
    log = tmp_path / "events.jsonl"
    cfg = config() + f'[logging]\njson = "{log}"\n'
    frames = [(T0, "inside", udp_from_host(B4_1)), (T0 + 0.1, "inside", udp_from_host(B4_2))]
    outs, _ = replay(replay_files, cfg, frames)
    ports = [p[UDP].sport for p in outside(outs)]
    for b4, port in zip([B4_1, B4_2], ports):
        p = natrix("whois", f"{POOL}:{port}", "--proto", "udp", "--at", str(int(T0) + 1), "--log", str(log), "--json")
        assert p.returncode == 0, h.proc_text(p)
        answers = json.loads(p.stdout)["answers"]
        assert [(a["b4"], a["subscriber"], a["subscriber_port"]) for a in answers] == [(b4, HOST, 5000)]
        text = natrix("whois", f"{POOL}:{port}", "--proto", "udp", "--at", str(int(T0) + 1), "--log", str(log)).stdout.decode()
        assert f"subscriber {HOST}:5000 behind B4 {b4}" in text, text


def pcp_map_request(client, iport, lifetime=3600):
    """RFC 6887 figures 2 and 9: a MAP request for UDP `iport`."""
    mapped = b"\x00" * 10 + b"\xff\xff" + bytes(int(x) for x in client.split("."))
    return struct.pack("!BBHI", 2, 1, 0, lifetime) + mapped + b"dslite-nonce" + struct.pack("!B3xHH", 17, iport, 0) + b"\x00" * 16


def test_pcp_through_the_softwire_maps_for_that_b4(replay_files):
    """A host behind a B4 asks the AFTR (192.0.0.1, RFC 6333 section 5.7)
    for a mapping, naming its own inner address: the answer comes back
    through its softwire, and an outside host reaches it at the mapped
    endpoint; another B4's host with the same address is not reached."""
    cfg = config() + '[pcp]\nenabled = true\n'
    req = softwire(B4_1, IP(src=HOST, dst=AFTR_V4) / UDP(sport=40404, dport=5351) / Raw(pcp_map_request(HOST, 6000)))
    outs, rep = replay(replay_files, cfg, [(T0, "inside", req)])
    answers = to_b4(outs, B4_1)
    assert len(answers) == 1, show(outs)
    i = inner_of(answers[0])
    assert (i.src, i.dst, i[UDP].sport, i[UDP].dport) == (AFTR_V4, HOST, 5351, 40404), i.summary()
    body = bytes(i[UDP].payload)
    assert body[1] == 0x81 and body[3] == 0, f"MAP response with result SUCCESS expected: {body[:4].hex()}"
    ext_port = struct.unpack("!H", body[24 + 18:24 + 20])[0]
    assert body[24 + 20:24 + 36][-4:] == bytes(int(x) for x in POOL.split("."))
    knock = h.eth_out() / IP(src=SERVER, dst=POOL) / UDP(sport=7777, dport=ext_port) / Raw(b"knock")
    outs, rep = replay(replay_files, cfg, [(T0, "inside", req), (T0 + 1, "outside", knock)])
    hits = [p for p in to_b4(outs) if UDP in inner_of(p) and bytes(inner_of(p)[UDP].payload) == b"knock"]
    assert len(hits) == 1 and hits[0][IPv6].dst == B4_1, show(outs)
    assert inner_of(hits[0])[UDP].dport == 6000


def test_pcp_rate_limit_is_per_host_not_per_inner_address(replay_files):
    """RFC 6887 section 18.1's per-client rate limit, with hosts behind
    different B4s that share one inner address (192.0.0.2, RFC 6333's B4
    range): B4_1's host spending its budget in one second does not silence
    B4_2's host in the same second."""
    cfg = config() + '[pcp]\nenabled = true\n'
    def req(b4, k):
        return softwire(b4, IP(src=HOST, dst=AFTR_V4) / UDP(sport=40404, dport=5351) / Raw(pcp_map_request(HOST, 6000 + k)))
    frames = [(T0 + 0.001 * k, "inside", req(B4_1, k)) for k in range(100)]
    frames.append((T0 + 0.5, "inside", req(B4_2, 0)))
    outs, rep = replay(replay_files, cfg, frames)
    assert len(to_b4(outs, B4_1)) == 100, show(outs)
    assert len(to_b4(outs, B4_2)) == 1, "B4_2's host is answered within the same second"


def test_an_icmp_error_from_outside_reaches_the_host_through_its_softwire(replay_files):
    """RFC 5508 through a softwire: the server's port unreachable about the
    host's datagram arrives for the pool address and leaves encapsulated to
    the B4, outer destination and quoted source both the host's inner
    address again."""
    frames = [(T0, "inside", udp_from_host(B4_1))]
    outs, _ = replay(replay_files, config(), frames)
    sent = outside(outs)[0]
    quote = bytes(sent[IP])[:28]
    err = h.icmp_error(h.eth_out(), SERVER, POOL, quote, icmp_type=3, code=3)
    frames.append((T0 + 1, "outside", err))
    outs, rep = replay(replay_files, config(), frames)
    back = to_b4(outs, B4_1)
    assert len(back) == 1, show(outs)
    i = inner_of(back[0])
    assert (i.src, i.dst, i[ICMP].type, i[ICMP].code) == (SERVER, HOST, 3, 3), i.summary()
    q = IP(bytes(i[ICMP].payload))
    assert (q.src, q.dst, q.sport) == (HOST, SERVER, 5000), "the quote is the host's datagram as it sent it"
    assert rep["packets"]["dropped"] == 0, rep["drops"]


def test_hairpinning_between_two_softwire_hosts(replay_files):
    """B4 2's host sends to B4 1's host's external endpoint: it arrives
    through B4 1's softwire from B4 2's host's external endpoint."""
    frames = [(T0, "inside", udp_from_host(B4_1)), (T0 + 0.1, "inside", udp_from_host(B4_2, sport=6000))]
    outs, _ = replay(replay_files, config(), frames)
    p1, p2 = [p[UDP].sport for p in outside(outs)]
    hairpin = softwire(B4_2, IP(src=HOST, dst=POOL) / UDP(sport=6000, dport=p1) / Raw(b"neighbour"))
    frames.append((T0 + 1, "inside", hairpin))
    outs, rep = replay(replay_files, config(), frames)
    hits = [p for p in to_b4(outs) if bytes(inner_of(p)[UDP].payload) == b"neighbour"]
    assert len(hits) == 1 and hits[0][IPv6].dst == B4_1, show(outs)
    i = inner_of(hits[0])
    assert (i.src, i[UDP].sport, i.dst, i[UDP].dport) == (POOL, p2, HOST, 5000), i.summary()


def test_bytes_after_the_inner_packet_are_not_forwarded(replay_files):
    """RFC 2473: the payload is the IPv4 packet; bytes past its total length
    (a B4 padding its payload) do not leave with it."""
    inner = bytes(IP(src=HOST, dst=SERVER) / UDP(sport=5000, dport=53) / Raw(b"query"))
    padded = Ether(src=B4_MAC, dst=h.NAT_IN_MAC) / IPv6(src=B4_1, dst=AFTR, nh=4) / Raw(inner + b"\xee" * 40)
    outs, _ = replay(replay_files, config(), [(T0, "inside", padded)])
    (sent,) = outside(outs)
    assert len(bytes(sent)) == 14 + len(inner) or len(bytes(sent)) == 60, f"{len(bytes(sent))} bytes left for a {len(inner)}-byte packet"
    assert b"\xee" * 8 not in bytes(sent)


def test_check_config_takes_the_contract_keys_and_names_the_key_at_fault(natrix, tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(config(dslite='b4_prefixes = ["2001:db8:100::/40"]\nmtu = 1540\nmss_clamp = 0\n'))
    p = natrix("check-config", str(good))
    assert p.returncode == 0, h.proc_text(p)
    assert f"DS-Lite AFTR {AFTR} (B4s in 1 prefix, softwire MTU 1540, MSS clamp 1460)" in p.stdout.decode()
    for body, key in [
        ('[nat]\npool = ["203.0.113.1/32"]\n[dslite]\naftr = "2001:db8::1"\nmtu = 1279\n', "dslite.mtu"),
        ('[nat]\npool = ["203.0.113.1/32"]\n[dslite]\nmtu = 1500\n', "dslite.aftr"),
        ('[nat]\npool = ["203.0.113.1/32"]\n[dslite]\naftr = "not-an-address"\n', "dslite.aftr"),
        ('[nat]\npool = ["203.0.113.1/32"]\n[dslite]\naftr = "2001:db8::1"\nmss_clamp = "on"\n', "dslite.mss_clamp"),
        ('[nat]\npool = ["203.0.113.1/32"]\n[dslite]\naftr = "2001:db8::1"\nb4_prefixes = ["2001:db8:100::1/40"]\n', "dslite.b4_prefixes[0]"),
        ('[nat]\nmode = "off"\n[dslite]\naftr = "2001:db8::1"\n', "dslite.aftr"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        p = natrix("check-config", str(bad))
        assert p.returncode != 0 and key in h.proc_text(p), (body, h.proc_text(p))


def test_inbound_ipv4_fragments_reach_the_host_through_its_softwire_even_out_of_order(replay_files):
    """Fragments translated without reassembly, a later one held until the
    first (natrix's [fragments] rule), each encapsulated to the B4."""
    frames = [(T0, "inside", udp_from_host(B4_1))]
    port = mapped_port(replay_files, config(), frames)
    whole = IP(src=SERVER, dst=POOL, id=4242) / UDP(sport=53, dport=port) / Raw(bytes(range(200)) * 5)
    first, second = fragment(whole, fragsize=600)
    frames += [(T0 + 1, "outside", h.eth_out() / second), (T0 + 1.1, "outside", h.eth_out() / first)]
    outs, rep = replay(replay_files, config(), frames)
    back = to_b4(outs, B4_1)
    assert len(back) == 2, show(outs)
    inner = [inner_of(p) for p in back]
    assert all(i.dst == HOST for i in inner), [i.summary() for i in inner]
    data = b"".join(bytes(i.payload) for i in sorted(inner, key=lambda i: i.frag))
    udp = UDP(data)
    assert (udp.dport, bytes(udp.payload)) == (5000, bytes(range(200)) * 5)
    h.verify_output_fragments([("inside", bytes(Ether(src=h.NAT_IN_MAC, dst=B4_MAC) / i)) for i in inner])


# Deterministic mode by B4 (README "DS-Lite", "Deterministic NAT"): each B4
# address in the IPv6 prefixes of [nat] subscribers is one subscriber,
# numbered in order; subscriber i gets pool[i / per_address] and ports
# lo + (i % per_address) * N .. + N - 1, shared by every host behind the B4.
DET_N = 1008
DET_B4S = "2001:db8:100::/123"    # 32 B4s: 2001:db8:100:: is subscriber 0
DET_OUTSIDER = "2001:db8:200::2"


def det_config():
    return (f'[nat]\nmode = "deterministic"\npool = ["{POOL}/32"]\nports = "1024-65535"\n'
            f'subscribers = ["{DET_B4S}"]\nports_per_subscriber = {DET_N}\n[dslite]\naftr = "{AFTR}"\n')


def det_range(b4_index):
    """The formula by hand: one pool address holds 64512 // 1008 = 64 ranges."""
    first = 1024 + (b4_index % (64512 // DET_N)) * DET_N
    return first, first + DET_N - 1


def det_frames():
    flows = [(B4_1, HOST, 5000), (B4_2, HOST, 5000), (B4_1, "10.0.0.7", 40000), (B4_2, HOST, 5001), (B4_1, HOST, 1024)]
    frames = [(T0 + k * 0.1, "inside", udp_from_host(b4, sport=sp, host=host)) for k, (b4, host, sp) in enumerate(flows)]
    frames.append((T0 + 1, "inside", udp_from_host(DET_OUTSIDER)))
    return flows, frames


def test_deterministic_mode_gives_each_b4_the_range_the_formula_predicts(replay_files):
    flows, frames = det_frames()
    outs, rep = replay(replay_files, det_config(), frames)
    sent = outside(outs)
    assert len(sent) == len(flows), show(outs)
    index = {B4_1: 2, B4_2: 3}
    for (b4, host, sport), p in zip(flows, sent):
        first, last = det_range(index[b4])
        assert p[IP].src == POOL and first <= p[UDP].sport <= last, f"{b4} {host}:{sport} left as {p[IP].src}:{p[UDP].sport}, expected {first}-{last}"
    assert len({p[UDP].sport for p in sent}) == len(sent), "two flows share an external port"
    assert rep["drops"] == {"not_subscriber": 1}, rep["drops"]
    # Replies reach the B4 whose range the port is in.
    replies = [(T0 + 2 + k * 0.1, "outside", udp_reply(p[UDP].sport, payload=b"r%d" % k)) for k, p in enumerate(sent)]
    outs, _ = replay(replay_files, det_config(), frames + replies)
    back = to_b4(outs)
    assert [(p[IPv6].dst, inner_of(p).dst, inner_of(p)[UDP].dport) for p in back] == flows, show(outs)
    # The same result on every run.
    again, _ = replay(replay_files, det_config(), frames + replies)
    assert [bytes(p) for _, p in again] == [bytes(p) for _, p in outs]


def test_whois_answers_a_deterministic_b4_config_with_the_b4(natrix, tmp_path):
    cfg = tmp_path / "det.toml"
    cfg.write_text(det_config())
    first, last = det_range(3)
    p = natrix("whois", f"{POOL}:{first + 17}", "--proto", "udp", "--config", str(cfg), "--json")
    assert p.returncode == 0, h.proc_text(p)
    answers = json.loads(p.stdout)["answers"]
    assert [(a["b4"], a["port_range"], a["source"]) for a in answers] == [(B4_2, [first, last], "deterministic")], answers
    assert "subscriber" not in answers[0], "the B4's hosts share its range: no inner address to name"
    text = natrix("whois", f"{POOL}:{first}", "--proto", "udp", "--config", str(cfg)).stdout.decode()
    assert f"B4 {B4_2} (port range {first}-{last}), shared by every host behind it" in text, text
    # Past the 32 B4s' ranges: nobody.
    p = natrix("whois", f"{POOL}:{1024 + 32 * DET_N}", "--proto", "udp", "--config", str(cfg))
    assert p.returncode == 1, h.proc_text(p)


def test_check_config_refuses_b4_numberings_that_do_not_work_and_names_the_problem(natrix, tmp_path):
    def det(subs, dslite=f'[dslite]\naftr = "{AFTR}"\n', n=DET_N):
        return f'[nat]\nmode = "deterministic"\npool = ["{POOL}/32"]\nsubscribers = [{subs}]\nports_per_subscriber = {n}\n{dslite}'
    for body, key, problem in [
        (det('"100.64.0.0/26"'), "nat.subscribers", "numbers B4s"),
        (det(f'"{DET_B4S}"', dslite=""), "nat.subscribers[0]", "needs [dslite]"),
        (det('"2001:db8:100::/120"'), "nat.subscribers", "256 subscribers do not fit"),
        (det('"2001:db8:100::/64"'), "nat.subscribers", "can hold 64 subscribers"),
        (det('"2001:db8:100::/122", "2001:db8:100::20/123"'), "nat.subscribers[1]", "overlaps nat.subscribers[0]"),
        (det('"::ffff:0:0/96"'), "nat.subscribers[0]", "IPv4-mapped"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        p = natrix("check-config", str(bad))
        out = h.proc_text(p)
        assert p.returncode != 0 and key in out and problem in out, (body, out)
    good = tmp_path / "good.toml"
    good.write_text(det_config())
    assert natrix("check-config", str(good)).returncode == 0


def test_common_softwire_packets_of_any_size_are_translated_alike(replay_files):
    """natrix recognises the common softwire shape (no extension header, an
    IPv4 packet without options, TCP or UDP) by fixed offsets; packets of
    that shape large enough for its fast path and short ones taken the
    generic way must come out the same: checksums right (scapy recomputes
    them), one mapping per host, replies back to the right B4."""
    big, small = b"x" * 60, b"y"
    frames = [
        (T0, "inside", udp_from_host(B4_1, payload=big)),
        (T0 + 0.1, "inside", udp_from_host(B4_2, payload=big)),
        (T0 + 0.2, "inside", udp_from_host(B4_1, payload=small)),
        (T0 + 0.3, "inside", softwire(B4_2, IP(src=HOST, dst=SERVER) / TCP(sport=6000, dport=80, flags="A", seq=1, ack=1) / Raw(big))),
        (T0 + 0.4, "inside", softwire(B4_2, IP(src=HOST, dst=SERVER) / TCP(sport=6000, dport=80, flags="A", seq=61, ack=1))),
    ]
    outs, rep = replay(replay_files, config(dslite='mss_clamp = "off"\n'), frames)
    sent = outside(outs)
    assert len(sent) == 5, show(outs)
    assert all(p[IP].src == POOL and p[IP].ttl == 63 for p in sent), show(outs)
    udp_ports = [p[UDP].sport for p in sent[:3]]
    assert udp_ports[0] == udp_ports[2] != udp_ports[1], f"one mapping per host whatever the size: {udp_ports}"
    assert sent[3][TCP].sport == sent[4][TCP].sport and bytes(sent[3][TCP].payload) == big
    assert rep["dslite"]["decapsulated"] == 5, rep["dslite"]
    replies = [(T0 + 1, "outside", udp_reply(udp_ports[1], size=100)), (T0 + 1.1, "outside", udp_reply(udp_ports[0], payload=b"z"))]
    outs, _ = replay(replay_files, config(dslite='mss_clamp = "off"\n'), frames + replies)
    assert [(p[IPv6].dst, inner_of(p)[UDP].dport) for p in to_b4(outs)] == [(B4_2, 5000), (B4_1, 5000)], show(outs)
