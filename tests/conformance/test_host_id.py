"""HOST_ID TCP options (seed 000 sections 3, 6, 7 and 8; CONTRACTS.md "HOST_ID
TCP options") in replay, judged by scapy.

Written from the seed and the contract, not from natrix's source:
- SYN mode (figure 5): the enabled options are inserted after the host's own
  options, which stay byte for byte (a trailing EOL and what follows it are
  replaced), followed by the fewest NOPs to a 4-byte boundary; data offset,
  IPv4 total length and both checksums right (every output frame's checksums
  are verified by the harness);
- the values come from the subscriber's own address and port, before NAPT44;
- no room (options would pass 40 bytes): nothing inserted, the SYN passes,
  counted as `host_id_no_room`;
- section 7.2: an enabled option present with wrong data is corrected in
  place, one present but not enabled is overwritten with NOPs;
- section 6.1's malformed options (bad lengths, EOL in the middle, an area
  already full) never crash natrix nor let a spoofed value through;
- ACK mode (figure 6): ENABLED rides the SYN, the server's echo is removed
  from the SYN-ACK, BOUCADAIR rides the client's first ACK, only after an echo;
- section 8: rules, first match wins, accept/log/drop/strip, values and
  ranges, on SYNs as they arrive, in `[nat] mode = "off"` too.
"""

import json
import socket

import pytest
from scapy.all import defragment, fragment
from scapy.layers.inet6 import IPv6

import natrix_harness as h
from natrix_harness import IP, POOL1, SRV1, SUB_A, SUB_B, T0, TCP, Raw, one, pick

WING, BOUCADAIR, ENABLED = 200, 201, 202  # the contract's default kinds
# Linux's SYN options (20 bytes).
LINUX = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (394712, 0)), ("NOP", None), ("WScale", 7)]
LINUX_BYTES = bytes([2, 4, 5, 180, 4, 2, 8, 10]) + (394712).to_bytes(4, "big") + bytes(4) + bytes([1, 3, 3, 7])
ISN = 123456789
# DS-Lite (CONTRACTS.md "DS-Lite AFTR"): two B4s in different /56s whose hosts
# both use RFC 6333's 192.0.0.2.
AFTR = "2001:db8:0:1::1"
B4_1, B4_2 = "2001:db8:100:ab00::2", "2001:db8:100:cd00::3"
B4_HOST = "192.0.0.2"
SPORT = 5482  # seed 000 figure 5's port


def config(host_id=None, rules=(), mode_off=False, log=None, dslite=False):
    base = '[nat]\nmode = "off"\n' if mode_off else h.make_config()
    lines = ["[host_id]"] + [f"{k} = {h._toml_value(v)}" for k, v in (host_id or {}).items()]
    for r in rules:
        lines.append("[[host_id.rule]]")
        lines += [f"{k} = {h._toml_value(v)}" for k, v in r.items()]
    text = base + "\n".join(lines) + "\n"
    if dslite:
        text += f'[dslite]\naftr = "{AFTR}"\n'
    if log is not None:
        text += f"[logging]\njson = {json.dumps(str(log))}\n"
    return text


def syn(options=LINUX, src=SUB_A, sport=SPORT, payload=b"", flags="S", seq=ISN):
    pkt = (h.eth_in(src) / IP(src=src, dst=SRV1, ttl=64, id=7)
           / TCP(sport=sport, dport=80, flags=flags, seq=seq, window=64240, options=options))
    return pkt / Raw(payload) if payload else pkt


def syn_raw_options(raw_options, src=SUB_A, sport=SPORT):
    """A SYN whose options area is exactly `raw_options` (a multiple of 4), bytes as given."""
    assert len(raw_options) % 4 == 0
    tcp = TCP(sport=sport, dport=80, flags="S", seq=ISN, window=64240, dataofs=5 + len(raw_options) // 4)
    pkt = h.eth_in(src) / IP(src=src, dst=SRV1, ttl=64, id=7) / tcp / Raw(raw_options)
    return h.Ether(bytes(pkt))  # scapy fills in lengths and checksums over the raw options


def tcp_options_area(pkt):
    """The raw options area of the frame's TCP header (bytes after the first 20)."""
    raw = bytes(pkt[TCP])
    hl = (raw[12] >> 4) * 4
    return raw[20:hl]


def parse_options(area):
    """An independent RFC 9293 options walk: [(kind, bytes)] up to EOL, or
    raises on a malformed option."""
    out, i = [], 0
    while i < len(area):
        k = area[i]
        if k == 0:
            break
        if k == 1:
            out.append((1, b"\x01"))
            i += 1
            continue
        ln = area[i + 1]
        assert ln >= 2 and i + ln <= len(area), f"malformed option at {i}: {area.hex()}"
        out.append((k, area[i:i + ln]))
        i += ln
    return out


def host_id_options(pkt, kinds=(WING, BOUCADAIR, ENABLED)):
    return [b for k, b in parse_options(tcp_options_area(pkt)) if k in kinds]


def syn_out(outs):
    return one(outs, "outside", lambda p: h.is_tcp(p) and p[TCP].flags == "S", "SYN").pkt


def wing_bytes(value):
    return bytes([WING, 4]) + value.to_bytes(2, "big")


def boucadair_bytes(origin, data, lifetime=0):
    return bytes([BOUCADAIR, 10, (lifetime << 4) | origin]) + data.ljust(7, b"\0")


def ip4(a):
    return bytes(int(x) for x in a.split("."))


def assert_inserted_after(out, host_options, inserted):
    """The contract's layout: the host's bytes, then ours, then the fewest NOPs."""
    area = tcp_options_area(out)
    expect = host_options + inserted
    expect += b"\x01" * (-len(expect) % 4)
    assert area == expect, f"options {area.hex()} != {expect.hex()}"
    t = out[TCP]
    assert t.dataofs == 5 + len(expect) // 4
    assert out[IP].len == 20 + 20 + len(expect) + len(h.l4_data(out))


# ---------------------------------------------------------------------------
# SYN mode: insertion (figure 5)
# ---------------------------------------------------------------------------


def test_figure_5_boucadair_in_the_syn_after_linux_options(replay):
    """Figure 5: the CGN adds HOST_ID_BOUCADAIR to the subscriber's SYN. With
    origin 2 (port then IPv4), its data are port 5482 and 100.64.0.10, the
    subscriber's own, not NAPT44's external ones."""
    outs, rep = replay(config({"mode": "syn", "boucadair": "port-ipv4"}), [(T0, "inside", syn())])
    out = syn_out(outs)
    assert out[IP].src == POOL1, "translated as usual"
    assert_inserted_after(out, LINUX_BYTES, boucadair_bytes(2, SPORT.to_bytes(2, "big") + ip4(SUB_A)))
    assert rep["host_id"]["injected"] == 1 and rep["host_id_no_room"] == 0


def test_each_option_and_origin_has_the_seeds_layout(replay):
    cases = [
        ({"wing": True}, wing_bytes(0x000A)),  # last 16 bits of 100.64.0.10 (section 8.4)
        ({"wing": True, "wing_data": "port"}, wing_bytes(SPORT)),
        ({"boucadair": "port"}, boucadair_bytes(0, SPORT.to_bytes(2, "big"))),
        ({"boucadair": "ipv4", "lifetime": 5}, boucadair_bytes(1, ip4(SUB_A), lifetime=5)),
        ({"enabled": True}, bytes([ENABLED, 2])),
        ({"wing": True, "boucadair": "ipv4", "enabled": True},
         wing_bytes(0x000A) + boucadair_bytes(1, ip4(SUB_A)) + bytes([ENABLED, 2])),
    ]
    for keys, inserted in cases:
        outs, _ = replay(config({"mode": "syn", **keys}), [(T0, "inside", syn())])
        assert_inserted_after(syn_out(outs), LINUX_BYTES, inserted)


def test_configured_kinds_are_used(replay):
    keys = {"mode": "syn", "wing": True, "kinds": {"wing": 253, "boucadair": 254, "enabled": 252}}
    outs, _ = replay(config(keys), [(T0, "inside", syn())])
    assert_inserted_after(syn_out(outs), LINUX_BYTES, bytes([253, 4, 0, 10]))


def test_a_syn_with_data_and_no_options_keeps_its_payload(replay):
    """The payload moves behind the longer header, unchanged (TCP Fast Open style)."""
    outs, _ = replay(config({"mode": "syn", "wing": True}), [(T0, "inside", syn(options=[], payload=b"GET / HTTP/1.0\r\n"))])
    out = syn_out(outs)
    assert_inserted_after(out, b"", wing_bytes(0x000A))
    assert h.l4_data(out) == b"GET / HTTP/1.0\r\n"


def test_each_subscriber_gets_its_own_value_and_a_spoof_is_corrected(replay):
    """Section 7.2 and the issue: a host can never pass another subscriber's
    HOST_ID through natrix. SUB_B writes SUB_A's WING itself."""
    spoof = [("MSS", 1460), (WING, (0x000A).to_bytes(2, "big"))]
    frames = [(T0, "inside", syn(src=SUB_A)), (T0 + 1, "inside", syn(options=spoof, src=SUB_B, sport=6000))]
    outs, rep = replay(config({"mode": "syn", "wing": True}), frames)
    by_port = {p.pkt[TCP].sport: p.pkt for p in pick(outs, "outside", h.is_tcp)}
    assert len(by_port) == 2
    values = sorted(host_id_options(p) for p in by_port.values())
    assert values == sorted([[wing_bytes(0x000A)], [wing_bytes(0x000B)]])
    b = next(p for p in by_port.values() if host_id_options(p) == [wing_bytes(0x000B)])
    assert tcp_options_area(b)[:8] == bytes([2, 4, 5, 180]) + wing_bytes(0x000B), "corrected in place, same length"
    assert rep["host_id"]["corrected"] == 1


def test_a_fragmented_syn_cannot_pass_another_subscribers_host_id(replay):
    """Section 7.2: a HOST_ID option present is verified and corrected, so a
    host cannot pass another subscriber's value, not by fragmenting its SYN
    either: natrix translates fragments without reassembling them, and the
    first fragment holds the whole TCP header. SUB_B writes SUB_A's WING
    into a SYN with data, sent in two fragments: the first leaves with
    SUB_B's own value in place, and the datagram put together from what
    leaves carries a valid TCP checksum."""
    spoof = [("MSS", 1460), (WING, (0x000A).to_bytes(2, "big"))]
    whole = syn(options=spoof, src=SUB_B, sport=6000, payload=b"x" * 64)
    first, later = fragment(whole[IP], fragsize=64)
    frames = [(T0, "inside", h.eth_in(SUB_B) / first), (T0 + 0.01, "inside", h.eth_in(SUB_B) / later)]
    outs, rep = replay(config({"mode": "syn", "wing": True}), frames)
    left = [o.pkt for o in outs if o.side == "outside" and IP in o.pkt]
    assert len(left) == 2, [p.summary() for p in left]
    head = next(p for p in left if p[IP].frag == 0)
    assert tcp_options_area(head)[:8] == bytes([2, 4, 5, 180]) + wing_bytes(0x000B), tcp_options_area(head).hex()
    joined = defragment([p[IP] for p in left])
    assert len(joined) == 1
    d = IP(bytes(joined[0]))
    raw = bytes(d[TCP])
    sent_sum = d[TCP].chksum
    del d[TCP].chksum
    assert IP(bytes(d))[TCP].chksum == sent_sum, "the TCP checksum over the whole datagram"
    assert rep["host_id"]["corrected"] == 1 and rep["host_id"]["no_room"] == 0
    assert raw[20 + 8:] == b"x" * 64


def test_a_wrong_lifetime_origin_byte_is_corrected_in_place(replay):
    wrong = boucadair_bytes(1, ip4("100.64.0.99"), lifetime=7)
    s = syn(options=[(BOUCADAIR, wrong[2:])])
    outs, rep = replay(config({"mode": "syn", "boucadair": "ipv4"}), [(T0, "inside", s)])
    out = syn_out(outs)
    assert tcp_options_area(out) == boucadair_bytes(1, ip4(SUB_A)) + tcp_options_area(s)[10:], "the host's padding stays"
    assert rep["host_id"]["corrected"] == 1 and rep["host_id"]["injected"] == 0


def test_an_option_present_but_not_enabled_becomes_nops(replay):
    """Section 7.2 ("retrieved") and 8.3 (NOPs, lengths never shrink)."""
    host = [("MSS", 1460), (BOUCADAIR, boucadair_bytes(1, ip4(SUB_A))[2:]), ("NOP", None), ("NOP", None)]
    outs, rep = replay(config({"mode": "syn", "wing": True}), [(T0, "inside", syn(options=host))])
    out = syn_out(outs)
    host_bytes = bytes([2, 4, 5, 180]) + b"\x01" * 10 + b"\x01\x01"
    assert_inserted_after(out, host_bytes, wing_bytes(0x000A))
    assert host_id_options(out) == [wing_bytes(0x000A)]
    assert rep["host_id"]["removed"] == 1


def test_mode_off_in_a_cgn_leaves_host_options_alone(replay):
    host = [("MSS", 1460), (WING, b"\x12\x34")]
    outs, _ = replay(config({"mode": "off"}, rules=[{"option": "enabled", "action": "accept"}]), [(T0, "inside", syn(options=host))])
    assert host_id_options(syn_out(outs)) == [wing_bytes(0x1234)]


def test_established_segments_are_untouched_in_syn_mode(replay):
    """Only SYNs carry HOST_ID in SYN mode: data segments pass as NAPT44 alone passes them."""
    data = (h.eth_in(SUB_A) / IP(src=SUB_A, dst=SRV1, ttl=64, id=9)
            / TCP(sport=SPORT, dport=80, flags="PA", seq=ISN + 1, ack=1, options=[("NOP", None), ("NOP", None), ("Timestamp", (1, 2))]) / Raw(b"x" * 100))
    plain, _ = replay(h.make_config(), [(T0, "inside", syn()), (T0 + 1, "inside", data)])
    with_id, _ = replay(config({"mode": "syn", "wing": True}), [(T0, "inside", syn()), (T0 + 1, "inside", data)])
    seg = lambda outs: bytes(one(outs, "outside", lambda p: h.is_tcp(p) and "P" in p[TCP].flags).pkt[IP])  # noqa: E731
    assert seg(plain) == seg(with_id)


# ---------------------------------------------------------------------------
# No room, and the malformed options of section 6.1
# ---------------------------------------------------------------------------


def full_area():
    """40 bytes of options: Linux's 20 and 20 NOPs."""
    return LINUX + [("NOP", None)] * 20


def test_options_already_filling_40_bytes_pass_unchanged_and_are_counted(replay):
    s = syn(options=full_area())
    outs, rep = replay(config({"mode": "syn", "wing": True}), [(T0, "inside", s)])
    out = syn_out(outs)
    assert tcp_options_area(out) == tcp_options_area(s), "nothing inserted, nothing moved"
    assert rep["host_id_no_room"] == 1 and rep["host_id"]["no_room"] == 1 and rep["host_id"]["injected"] == 0


def test_options_that_do_not_all_fit_are_none_inserted_but_corrections_still_happen(replay):
    """32 bytes of host options with a wrong WING: WING is corrected in place;
    BOUCADAIR (10) would pass 40 bytes, so it is not inserted."""
    host = LINUX + [(WING, b"\x99\x99")] + [("NOP", None)] * 8
    s = syn(options=host)
    assert len(tcp_options_area(s)) == 32
    outs, rep = replay(config({"mode": "syn", "wing": True, "boucadair": "ipv4"}), [(T0, "inside", s)])
    out = syn_out(outs)
    assert host_id_options(out) == [wing_bytes(0x000A)]
    assert len(tcp_options_area(out)) == 32
    assert rep["host_id"]["no_room"] == 1 and rep["host_id"]["corrected"] == 1


def test_exactly_40_bytes_fit(replay):
    host = LINUX + [("NOP", None)] * 16  # 36 bytes, WING makes 40
    outs, rep = replay(config({"mode": "syn", "wing": True}), [(T0, "inside", syn(options=host))])
    out = syn_out(outs)
    assert_inserted_after(out, tcp_options_area(syn(options=host)), wing_bytes(0x000A))
    assert out[TCP].dataofs == 15 and rep["host_id_no_room"] == 0


def test_eol_in_the_middle_hides_nothing(replay):
    """MSS, EOL, then bytes after the EOL that look like a WING with another
    subscriber's value: after EOL is padding (RFC 9293), natrix writes its
    options where the EOL was, and no reader can find the hidden value."""
    raw = bytes([2, 4, 5, 180, 0]) + wing_bytes(0x000B) + bytes(3)
    outs, rep = replay(config({"mode": "syn", "wing": True}), [(T0, "inside", syn_raw_options(raw))])
    out = syn_out(outs)
    area = tcp_options_area(out)
    assert parse_options(area)[:2] == [(2, bytes([2, 4, 5, 180])), (WING, wing_bytes(0x000A))]
    assert wing_bytes(0x000B) not in area
    assert len(area) == 12, "it fitted where the padding was: the header did not grow"


def test_a_bad_length_is_malformed_nothing_is_inserted_and_the_syn_passes(replay):
    """Section 6.1.4: options whose length does not match what follows. A
    length of 1, and one that runs past the header."""
    for raw in (bytes([2, 4, 5, 180, 99, 1, 0, 0]), bytes([2, 4, 5, 180, 99, 12, 0, 0])):
        s = syn_raw_options(raw)
        outs, rep = replay(config({"mode": "syn", "wing": True}), [(T0, "inside", s)])
        out = syn_out(outs)
        assert tcp_options_area(out) == raw, "left as the host wrote it"
        assert rep["host_id"]["malformed"] == 1 and rep["host_id"]["injected"] == 0


def test_a_host_id_option_of_the_wrong_length_is_replaced(replay):
    """A WING kind of length 6 is no WING: its bytes become NOPs and a correct
    WING is inserted."""
    host = [("MSS", 1460), (WING, b"\x00\x0b\x00\x00")]
    outs, rep = replay(config({"mode": "syn", "wing": True}), [(T0, "inside", syn(options=host))])
    out = syn_out(outs)
    assert host_id_options(out) == [wing_bytes(0x000A)]
    assert_inserted_after(out, bytes([2, 4, 5, 180]) + b"\x01" * 6, wing_bytes(0x000A))
    assert rep["host_id"]["removed"] == 1


# ---------------------------------------------------------------------------
# ACK mode (figure 6)
# ---------------------------------------------------------------------------


def syn_ack(ext, port, options):
    return (h.eth_out() / IP(src=SRV1, dst=ext, ttl=64, id=11)
            / TCP(sport=80, dport=port, flags="SA", seq=777, ack=ISN + 1, window=65160, options=options))


def client_ack(seq_off=1, payload=b"", options=()):
    pkt = (h.eth_in(SUB_A) / IP(src=SUB_A, dst=SRV1, ttl=64, id=12)
           / TCP(sport=SPORT, dport=80, flags="A" if not payload else "PA", seq=ISN + seq_off, ack=778, window=502,
                 options=list(options)))
    return pkt / Raw(payload) if payload else pkt


ACK_MODE = {"mode": "ack", "boucadair": "port-ipv4"}


def test_figure_6_enabled_in_the_syn_echo_removed_boucadair_in_the_first_ack(replay):
    first, _ = replay(config(ACK_MODE), [(T0, "inside", syn())])
    out = syn_out(first)
    assert_inserted_after(out, LINUX_BYTES, bytes([ENABLED, 2]))
    ext, port = out[IP].src, out[TCP].sport
    echo = [("MSS", 1400), (ENABLED, b""), ("NOP", None), ("NOP", None)]
    frames = [(T0, "inside", syn()), (T0 + 0.01, "outside", syn_ack(ext, port, echo)),
              (T0 + 0.02, "inside", client_ack()), (T0 + 0.03, "inside", client_ack(payload=b"GET /"))]
    outs, rep = replay(config(ACK_MODE), frames)
    sa = one(outs, "inside", lambda p: h.is_tcp(p) and p[TCP].flags == "SA", "SYN-ACK").pkt
    assert tcp_options_area(sa) == bytes([2, 4, 5, 120]) + b"\x01\x01" + b"\x01\x01", "the echo is NOPs"
    acks = pick(outs, "outside", lambda p: h.is_tcp(p) and p[TCP].flags in ("A", "PA"))
    assert len(acks) == 2
    assert_inserted_after(acks[0].pkt, b"", boucadair_bytes(2, SPORT.to_bytes(2, "big") + ip4(SUB_A)))
    assert host_id_options(acks[1].pkt) == [], "only the first ACK"
    assert h.l4_data(acks[1].pkt) == b"GET /"
    assert rep["host_id"]["echoes_removed"] == 1 and rep["host_id"]["acks_injected"] == 1


@pytest.mark.parametrize("mss,data,inserted", [(1000, 988, True), (1000, 989, False), (None, 524, True), (None, 525, False)])
def test_a_first_ack_with_data_grows_only_within_the_servers_mss(replay, mss, data, inserted):
    """RFC 6691 section 2: a sender "MUST reduce the TCP data length to
    account for any IP or TCP options that it is including": a first ACK
    carrying data (a client with a write pending piggybacks it) gets
    BOUCADAIR (12 bytes with its padding) only while data and options stay
    within the MSS the server announced in its SYN-ACK (536 when it
    announced none, RFC 9293 section 3.7.1); otherwise it passes as it is,
    counted as no_room."""
    first, _ = replay(config(ACK_MODE), [(T0, "inside", syn())])
    out = syn_out(first)
    echo = ([("MSS", mss)] if mss else []) + [(ENABLED, b""), ("NOP", None), ("NOP", None)]
    frames = [(T0, "inside", syn()), (T0 + 0.01, "outside", syn_ack(out[IP].src, out[TCP].sport, echo)),
              (T0 + 0.02, "inside", client_ack(payload=b"d" * data))]
    outs, rep = replay(config(ACK_MODE), frames)
    ack = one(outs, "outside", lambda p: h.is_tcp(p) and p[TCP].flags == "PA", "first ACK").pkt
    assert h.l4_data(ack) == b"d" * data
    if inserted:
        assert_inserted_after(ack, b"", boucadair_bytes(2, SPORT.to_bytes(2, "big") + ip4(SUB_A)))
        assert len(bytes(ack[TCP])) - 20 <= (mss or 536), "data and options within the MSS"
        assert rep["host_id"]["acks_injected"] == 1 and rep["host_id"]["no_room"] == 0
    else:
        assert host_id_options(ack) == [] and len(bytes(ack[TCP])) == 20 + data
        assert rep["host_id"]["acks_injected"] == 0 and rep["host_id"]["no_room"] == 1


def test_ack_mode_without_an_echo_sends_no_boucadair(replay):
    first, _ = replay(config(ACK_MODE), [(T0, "inside", syn())])
    out = syn_out(first)
    frames = [(T0, "inside", syn()), (T0 + 0.01, "outside", syn_ack(out[IP].src, out[TCP].sport, [("MSS", 1400)])),
              (T0 + 0.02, "inside", client_ack())]
    outs, rep = replay(config(ACK_MODE), frames)
    ack = one(outs, "outside", lambda p: h.is_tcp(p) and p[TCP].flags == "A", "ACK").pkt
    assert host_id_options(ack) == [] and rep["host_id"]["acks_injected"] == 0


def test_ack_mode_rules_judge_the_first_ack_and_no_later_one(replay):
    """CONTRACTS.md: rules inspect SYNs and, in ACK mode, the first ACK (the
    one after the SYN-ACK, which carries BOUCADAIR in figure 6). A forbidden
    WING in that ACK is dropped, and the connection with it (seed 000
    section 8.5: as a dropped SYN denies a connection): the client's next
    segment, which would complete the handshake at the server (RFC 9293
    section 3.10.7.4), is dropped too, until the client resets. The same
    WING in a later ACK is not judged by the rules (it passes, the host's
    option overwritten with NOPs as ACK mode does to HOST_ID a host writes
    outside the first ACK)."""
    first, _ = replay(config(ACK_MODE), [(T0, "inside", syn())])
    out = syn_out(first)
    forbidden = [(WING, b"\x0b\xad"), ("NOP", None), ("NOP", None)]
    cfg = config(ACK_MODE, rules=[{"option": "wing", "value": "0x0bad", "action": "drop"}])

    def run(first_ack_options, later_ack_options, then=()):
        frames = [(T0, "inside", syn()), (T0 + 0.01, "outside", syn_ack(out[IP].src, out[TCP].sport, [("MSS", 1400)])),
                  (T0 + 0.02, "inside", client_ack(options=first_ack_options)),
                  (T0 + 0.03, "inside", client_ack(payload=b"GET /", options=later_ack_options))]
        return replay(cfg, frames + list(then))

    def acks_out(outs):
        return pick(outs, "outside", lambda p: h.is_tcp(p) and "A" in p[TCP].flags and "S" not in p[TCP].flags)

    rst = h.eth_in(SUB_A) / IP(src=SUB_A, dst=SRV1, ttl=64) / TCP(sport=SPORT, dport=80, flags="R", seq=ISN + 6)
    again = syn(seq=ISN + 100000)
    outs, rep = run(forbidden, (), then=[(T0 + 60, "inside", client_ack(payload=b"GET /x")), (T0 + 61, "inside", rst),
                                         (T0 + 62, "inside", client_ack(payload=b"after")), (T0 + 63, "inside", again),
                                         (T0 + 64, "inside", client_ack(payload=b"anew"))])
    assert [h.l4_data(a.pkt) for a in acks_out(outs)] == [b"anew"], (
        "the first ACK and the connection's later segments are dropped, a RST passing but lifting nothing, until a new SYN")
    assert len(pick(outs, "outside", lambda p: h.is_tcp(p) and "R" in p[TCP].flags)) == 1, "the client's RST reaches the server"
    assert rep["host_id"]["rules"][0]["matched"] == 1 and rep["drops"]["host_id_policy"] == 4

    # An ACK that acknowledges something else than the SYN-ACK (a stale or
    # forged one) is no first ACK: not judged, so it refuses nothing, and
    # the real first ACK after it is still judged.
    stale = client_ack(options=forbidden)
    stale[TCP].ack = 5000
    outs, rep = replay(cfg, [(T0, "inside", syn()), (T0 + 0.01, "outside", syn_ack(out[IP].src, out[TCP].sport, [("MSS", 1400)])),
                             (T0 + 0.015, "inside", stale), (T0 + 0.02, "inside", client_ack(options=forbidden)),
                             (T0 + 0.03, "inside", client_ack(payload=b"GET /"))])
    assert [h.l4_data(a.pkt) for a in acks_out(outs)] == [b""], "the stale ACK passes; the real first ACK and the data are refused"
    assert rep["host_id"]["rules"][0]["matched"] == 1 and rep["drops"]["host_id_policy"] == 2

    outs, rep = run((), forbidden)
    acks = acks_out(outs)
    assert [h.l4_data(a.pkt) for a in acks] == [b"", b"GET /"], "the later ACK is not judged: it passes"
    assert host_id_options(acks[1].pkt) == [], "its WING became NOPs"
    assert rep["host_id"]["rules"][0]["matched"] == 0


def test_a_bump_in_the_wire_judges_the_first_ack_a_remote_cgn_fills(replay):
    """Seed 000 sections 3.2.2 and 8: a server behind natrix (a bump in the
    wire, [nat] mode = "off", with rules) echoes ENABLED in its SYN-ACK; the
    client's CGN, in ACK mode, puts BOUCADAIR in the first ACK. natrix
    passes the echo on untouched, judges that first ACK by the rules, and
    a drop refuses the connection: the data after it is dropped too. A
    connection whose server echoed nothing is not followed: its first ACK,
    with the same BOUCADAIR, passes."""
    value = boucadair_bytes(2, (40000).to_bytes(2, "big") + ip4("198.51.100.7"))[2:]
    cfg = config(rules=[{"option": "boucadair", "action": "drop"}], mode_off=True)
    client = "192.0.2.50"

    def conn(sport, echo):
        syn_in = inbound_syn([("MSS", 1460)], src=client, sport=sport)
        sa = (h.eth_in(SUB_A) / IP(src=SUB_A, dst=client, ttl=64)
              / TCP(sport=80, dport=sport, flags="SA", seq=5000, ack=ISN + 1,
                    options=[("MSS", 1460)] + ([(ENABLED, b""), ("NOP", None), ("NOP", None)] if echo else [])))
        ack = (h.eth_out() / IP(src=client, dst=SUB_A, ttl=64)
               / TCP(sport=sport, dport=80, flags="A", seq=ISN + 1, ack=5001, options=[(BOUCADAIR, value)]))
        data = h.eth_out() / IP(src=client, dst=SUB_A, ttl=64) / TCP(sport=sport, dport=80, flags="PA", seq=ISN + 1, ack=5001) / b"GET /"
        return [syn_in, sa, ack, data]

    frames = [(T0 + i * 0.01, "outside" if f[IP].src == client else "inside", f)
              for i, f in enumerate(conn(41000, True) + conn(41001, False))]
    outs, rep = replay(cfg, frames)
    sa = [o.pkt for o in outs if o.side == "outside" and h.is_tcp(o.pkt) and o.pkt[TCP].flags == "SA" and o.pkt[TCP].dport == 41000]
    assert len(sa) == 1 and ENABLED in [k for k, _ in parse_options(tcp_options_area(sa[0]))], "the echo passes to the client's CGN"
    to_server = [(o.pkt[TCP].sport, str(o.pkt[TCP].flags)) for o in outs if o.side == "inside" and h.is_tcp(o.pkt)]
    assert to_server == [(41000, "S"), (41001, "S"), (41001, "A"), (41001, "PA")], to_server
    assert rep["drops"] == {"host_id_policy": 2} and rep["host_id"]["rules"][0]["matched"] == 1, rep


def test_ack_mode_never_puts_boucadair_in_the_syn(replay):
    host = [("MSS", 1460), (BOUCADAIR, boucadair_bytes(1, ip4(SUB_A))[2:])]
    outs, rep = replay(config(ACK_MODE), [(T0, "inside", syn(options=host))])
    assert host_id_options(syn_out(outs)) == [bytes([ENABLED, 2])]
    assert rep["host_id"]["removed"] == 1


# ---------------------------------------------------------------------------
# Server-side policy (section 8), in front of servers: [nat] mode = "off"
# ---------------------------------------------------------------------------


def inbound_syn(options, src="192.0.2.50", sport=40000, flags="S", payload=b""):
    """A SYN from the internet (arriving outside) to a server behind natrix."""
    return (h.eth_out() / IP(src=src, dst=SUB_A, ttl=64, id=sport)
            / TCP(sport=sport, dport=80, flags=flags, seq=ISN, window=64240, options=options) / payload)


def test_drop_a_wing_range_others_pass(replay):
    rules = [{"option": "wing", "value": "1000-2000", "action": "drop"}]
    frames = [(T0 + i, "outside", inbound_syn([("MSS", 1460), (WING, v.to_bytes(2, "big"))], sport=40000 + i))
              for i, v in enumerate((999, 1000, 1500, 2000, 2001))]
    outs, rep = replay(config(rules=rules, mode_off=True), frames)
    passed = sorted(p.pkt[TCP].sport for p in pick(outs, "inside", h.is_tcp))
    assert passed == [40000, 40004]
    assert rep["drops"] == {"host_id_policy": 3}
    assert rep["host_id"]["rules"] == [{"option": "wing", "action": "drop", "matched": 3}]


def test_a_syn_whose_header_is_split_across_fragments_cannot_evade_the_rules(replay):
    """RFC 1858's fragment tricks, in a bump in the wire (no translation)
    with rules. A SYN whose first fragment stops inside its TCP header
    (after 24 of its 28 header bytes, its WING in the next fragment) would
    reach the server without any rule having seen its options: it is
    dropped (fragment_too_small, as NAPT44 drops it). A later fragment
    starting within the first 60 bytes could overwrite options the rules
    judged: dropped (fragment_in_tcp_header). A first fragment holding the
    whole header is judged as a whole SYN (a matching WING dropped by the
    rule, another value passed, with its later fragment at offset 64)."""
    rules = [{"option": "wing", "value": "1000-2000", "action": "drop"}]
    bad = inbound_syn([("MSS", 1460), (WING, (1500).to_bytes(2, "big"))], sport=41000)
    first, later = fragment(bad[IP], fragsize=24)
    assert len(bytes(first[IP].payload)) == 24 and first[IP].flags.MF, "the first fragment ends inside the 28-byte TCP header"
    whole_head = [inbound_syn([(WING, v.to_bytes(2, "big"))], sport=41001 + i, payload=b"y" * 80)[IP] for i, v in enumerate((1500, 3000))]
    frames = [(T0, "outside", h.eth_out() / first), (T0 + 0.01, "outside", h.eth_out() / later)]
    for i, d in enumerate(whole_head):
        for j, f in enumerate(fragment(d, fragsize=64)):
            frames.append((T0 + 1 + i + j * 0.01, "outside", h.eth_out() / f))
    outs, rep = replay(config(rules=rules, mode_off=True), frames)
    inside = [o.pkt for o in outs if o.side == "inside" and IP in o.pkt]
    # A bump forwards a later fragment on its own: without its first, the
    # server never puts the refused SYN together.
    assert [(p[IP].id, p[IP].frag) for p in inside] == [(41001, 8), (41002, 0), (41002, 8)], [p.summary() for p in inside]
    assert rep["drops"] == {"fragment_too_small": 1, "fragment_in_tcp_header": 1, "host_id_policy": 1}, rep["drops"]


def test_strip_any_leaves_nops_of_the_same_length(replay):
    """Section 8.3: the options' bytes become NOPs; the header keeps its length."""
    s = inbound_syn([("MSS", 1460), (WING, b"\x00\x0a"), (BOUCADAIR, boucadair_bytes(1, ip4(SUB_A))[2:]), (ENABLED, b"")])
    outs, rep = replay(config(rules=[{"option": "any", "action": "strip"}], mode_off=True), [(T0, "outside", s)])
    out = one(outs, "inside", h.is_tcp, "SYN").pkt
    assert tcp_options_area(out) == bytes([2, 4, 5, 180]) + b"\x01" * 16
    assert out[IP].ttl == 63 and out[IP].len == len(bytes(s[IP]))


def test_strip_one_option_keeps_the_others(replay):
    s = inbound_syn([("MSS", 1460), (WING, b"\x00\x0a"), (ENABLED, b""), ("NOP", None), ("NOP", None)])
    outs, _ = replay(config(rules=[{"option": "wing", "action": "strip"}], mode_off=True), [(T0, "outside", s)])
    out = one(outs, "inside", h.is_tcp, "SYN").pkt
    assert host_id_options(out) == [bytes([ENABLED, 2])]


def test_first_match_wins_and_no_match_accepts(replay, tmp_path):
    log = tmp_path / "events.jsonl"
    rules = [
        {"option": "boucadair", "value": "0x0164400000000000-0x01644000ffffffff", "action": "log"},
        {"option": "boucadair", "action": "drop"},
        {"option": "enabled", "action": "accept"},
    ]
    inside_range = boucadair_bytes(1, ip4("100.64.0.10"))[2:]
    outside_range = boucadair_bytes(1, ip4("100.65.0.10"))[2:]
    frames = [
        (T0, "outside", inbound_syn([(BOUCADAIR, inside_range)], sport=40001)),   # log, passes
        (T0 + 1, "outside", inbound_syn([(BOUCADAIR, outside_range)], sport=40002)),  # drop
        (T0 + 2, "outside", inbound_syn([(ENABLED, b"")], sport=40003)),          # accept
        (T0 + 3, "outside", inbound_syn([("MSS", 1460)], sport=40004)),           # no HOST_ID: no rule
    ]
    outs, rep = replay(config(rules=rules, mode_off=True, log=log), frames)
    assert sorted(p.pkt[TCP].sport for p in pick(outs, "inside", h.is_tcp)) == [40001, 40003, 40004]
    assert [r["matched"] for r in rep["host_id"]["rules"]] == [1, 1, 1]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    hid = [e for e in events if e["event"] == "host_id"]
    assert len(hid) == 1
    e = hid[0]
    assert (e["rule"], e["option"], e["value"]) == (0, "boucadair", 0x0164_4000_0A00_0000)
    assert (e["src"], e["src_port"], e["dst"], e["dst_port"]) == ("192.0.2.50", 40001, SUB_A, 80)
    assert e["time"].startswith("1970-01-01T00:16:40")


def test_rules_inspect_syns_not_syn_acks(replay):
    rules = [{"option": "any", "action": "drop"}]
    sa = inbound_syn([(WING, b"\x00\x0a")], flags="SA")
    outs, rep = replay(config(rules=rules, mode_off=True), [(T0, "outside", sa)])
    assert len(pick(outs, "inside", h.is_tcp)) == 1 and rep["drops"] == {}


def test_rules_see_the_syn_as_it_arrived_before_natrix_inserts(replay):
    """A CGN with rules and SYN mode: a rule on WING judges the host's own
    option (here absent, so no rule matches), then natrix inserts its WING."""
    rules = [{"option": "wing", "action": "drop"}]
    outs, rep = replay(config({"mode": "syn", "wing": True}, rules=rules), [(T0, "inside", syn())])
    assert host_id_options(syn_out(outs)) == [wing_bytes(0x000A)]
    assert rep["drops"] == {}
    outs, rep = replay(config({"mode": "syn", "wing": True}, rules=rules), [(T0, "inside", syn(options=[(WING, b"\x00\x0a")]))])
    assert rep["drops"] == {"host_id_policy": 1}


def test_router_mode_injects_for_subscribers_too(replay):
    """[nat] mode = "off": the subscriber's SYN leaves outside untranslated, with WING."""
    outs, _ = replay(config({"mode": "syn", "wing": True}, mode_off=True), [(T0, "inside", syn())])
    out = syn_out(outs)
    assert out[IP].src == SUB_A and out[IP].ttl == 63
    assert_inserted_after(out, LINUX_BYTES, wing_bytes(0x000A))


# ---------------------------------------------------------------------------
# check-config
# ---------------------------------------------------------------------------


def test_check_config_accepts_the_contract_keys_and_names_bad_values(natrix, tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(config({"mode": "syn", "wing": True, "wing_data": "port", "boucadair": "port-ipv4", "lifetime": 0,
                            "enabled": True, "kinds": {"wing": 200, "boucadair": 201, "enabled": 202}},
                           rules=[{"option": "wing", "value": "0x0a-0xff", "action": "log"}]))
    assert natrix("check-config", str(good)).returncode == 0
    good.write_text(config({"mode": "syn", "boucadair": "ipv6-prefix"}, dslite=True))
    assert natrix("check-config", str(good)).returncode == 0, "origin 3 with [dslite]"
    for keys, rules, key, words in [
        ({"mode": "sometimes"}, [], "host_id.mode", "\"sometimes\""),
        ({"boucadair": "mac"}, [], "host_id.boucadair", "\"mac\""),
        ({"lifetime": 99}, [], "host_id.lifetime", "99"),
        ({"kinds": {"wing": 1}}, [], "host_id.kinds.wing", "1"),
        ({}, [{"option": "wing", "value": "5-3", "action": "drop"}], "host_id.rule[0].value", "\"5-3\""),
        ({}, [{"option": "wing", "action": "block"}], "host_id.rule[0].action", "\"block\""),
        ({"mode": "syn", "boucadair": "ipv6-prefix"}, [], "host_id.boucadair", "[dslite]"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(config(keys, rules=rules))
        p = natrix("check-config", str(bad))
        text = p.stdout + p.stderr
        text = text.decode() if isinstance(text, bytes) else text
        assert p.returncode != 0 and key in text and words in text, text


# ---------------------------------------------------------------------------
# DS-Lite: origin 3, the B4's first 56 bits (seed 000 section 7.1)
# ---------------------------------------------------------------------------


# Linux's SYN options with an MSS below DS-Lite's clamp (1420 for the default
# MTU of 1500), which would otherwise lower it.
SOFTWIRE_LINUX = [("MSS", 1400)] + LINUX[1:]
SOFTWIRE_LINUX_BYTES = bytes([2, 4, 5, 120]) + LINUX_BYTES[4:]


def softwire_syn(b4, seq, options=SOFTWIRE_LINUX):
    """Ethernet / IPv6 (B4 -> AFTR, next header 4) / the host's IPv4 SYN (RFC 2473)."""
    inner = IP(src=B4_HOST, dst=SRV1, ttl=64, id=7) / TCP(sport=SPORT, dport=80, flags="S", seq=seq, window=64240, options=options)
    return h.Ether(src="02:00:00:00:0b:04", dst=h.NAT_IN_MAC) / IPv6(src=b4, dst=AFTR, nh=4, hlim=64) / inner


def b4_prefix56(b4):
    """The first 56 bits of an IPv6 address, as scapy's inet_pton gives its bytes."""
    return socket.inet_pton(socket.AF_INET6, b4)[:7]


def test_origin_3_carries_each_b4s_first_56_bits(replay):
    """Seed 000 section 7.1: the AFTR's BOUCADAIR may carry "56 bits of
    Tunnel Softwire IPv6 Source Address". Two B4s whose hosts send the same
    SYN from 192.0.0.2:5482 each get their own B4's /56 (origin 3), and WING's
    low 16 bits are the host's own inner address, not anything of natrix's."""
    cfg = config({"mode": "syn", "wing": True, "boucadair": "ipv6-prefix", "lifetime": 2}, dslite=True)
    frames = [(T0, "inside", softwire_syn(B4_1, ISN)), (T0 + 0.1, "inside", softwire_syn(B4_2, ISN + 1000))]
    outs, rep = replay(cfg, frames)
    syns = pick(outs, "outside", lambda p: h.is_tcp(p) and p[TCP].flags == "S")
    assert len(syns) == 2, h.dump(outs)
    by_seq = {s.pkt[TCP].seq: s.pkt for s in syns}
    for b4, seq in [(B4_1, ISN), (B4_2, ISN + 1000)]:
        out = by_seq[seq]
        assert out[IP].src == POOL1 and IPv6 not in out, "decapsulated and translated as usual"
        assert_inserted_after(out, SOFTWIRE_LINUX_BYTES, wing_bytes(0x0002) + boucadair_bytes(3, b4_prefix56(b4), lifetime=2))
    assert b4_prefix56(B4_1) != b4_prefix56(B4_2)
    assert rep["host_id"]["injected"] == 2 and rep["host_id"]["no_b4"] == 0


def test_origin_3_corrects_a_host_spoofing_another_b4(replay):
    """Section 7.2: a host behind B4_2 that writes B4_1's prefix has it corrected in place."""
    spoof = boucadair_bytes(3, b4_prefix56(B4_1))
    raw = bytes([2, 4, 5, 120, 1, 1]) + spoof
    tcp = TCP(sport=SPORT, dport=80, flags="S", seq=ISN, window=64240, dataofs=5 + len(raw) // 4)
    inner = IP(src=B4_HOST, dst=SRV1, ttl=64, id=7) / tcp / Raw(raw)
    frame = h.Ether(src="02:00:00:00:0b:04", dst=h.NAT_IN_MAC) / IPv6(src=B4_2, dst=AFTR, nh=4, hlim=64) / IP(bytes(inner))
    outs, rep = replay(config({"mode": "syn", "boucadair": "ipv6-prefix"}, dslite=True), [(T0, "inside", frame)])
    out = syn_out(outs)
    assert tcp_options_area(out) == bytes([2, 4, 5, 120, 1, 1]) + boucadair_bytes(3, b4_prefix56(B4_2))
    assert rep["host_id"]["corrected"] == 1 and rep["host_id"]["injected"] == 0


def test_origin_3_leaves_plain_ipv4_subscribers_without_boucadair_and_counts_them(replay):
    """natrix's choice (CONTRACTS.md is silent; seed 000 gives origin 3 only
    to DS-Lite hosts): a plain IPv4 subscriber beside the softwires has no B4,
    so its SYN carries the other enabled options but no BOUCADAIR, counted as
    `no_b4`; a BOUCADAIR its host wrote is removed (NOPs), as any option natrix
    does not write, so it cannot pose as a B4."""
    cfg = config({"mode": "syn", "wing": True, "boucadair": "ipv6-prefix"}, dslite=True)
    spoof = boucadair_bytes(3, b4_prefix56(B4_1))
    outs, rep = replay(cfg, [(T0, "inside", syn_raw_options(spoof + bytes([1, 1])))])
    out = syn_out(outs)
    assert host_id_options(out) == [wing_bytes(0x000A)], tcp_options_area(out).hex()
    assert tcp_options_area(out)[:10] == b"\x01" * 10, "the host's BOUCADAIR became NOPs"
    assert rep["host_id"]["no_b4"] == 1 and rep["host_id"]["removed"] == 1


def test_the_syn_accelerators_copies_carry_host_id(replay):
    """With [syn_accel] too, natrix's copies of the SYN are the SYN as it
    left, HOST_ID included (CONTRACTS.md "SYN accelerator": byte copies)."""
    cfg = config({"mode": "syn", "wing": True}) + f'[syn_accel]\ndestinations = ["{SRV1}/32:80"]\n'
    outs, rep = replay(cfg, [(T0, "inside", syn())])
    syns = pick(outs, "outside", lambda p: h.is_tcp(p) and p[TCP].flags == "S")
    assert len(syns) == 4, "the first SYN and three copies"
    assert all(bytes(s.pkt) == bytes(syns[0].pkt) for s in syns)
    assert host_id_options(syns[0].pkt) == [wing_bytes(0x000A)]
