"""Capture formats (contract "Captures") and router behaviour: TTL decrement
and ICMP time exceeded (contract; RFC 1812 sec 5.3.1, 4.3.2.4), 802.1Q tags."""

import pytest

import natrix_harness as h
from natrix_harness import (
    ICMP, IP, INSIDE_ADDR, POOL1, SRV1, SRV2, SUB_A, SUB_B, T0, UDP, Dot1Q, Ether, Raw, has_payload, icmp_info,
    none_of, one, pick, udp_in, udp_out,
)


def _pcap_writer(nanos):
    def w(d, frames):
        p = d / "in.pcap"
        h.write_pcap(p, frames, nanos=nanos)
        return p
    return w


@pytest.mark.parametrize("nanos", [False, True], ids=["usec", "nsec"])
def test_plain_pcap_input_is_all_inside(replay, nanos):
    """Contract: IN may be a plain pcap (Ethernet); all its frames arrive
    inside. They are translated and leave on the outside with their
    timestamps; a frame addressed to a pool address in a plain pcap still
    arrives inside (it hairpins rather than being taken as inbound)."""
    frames = [
        (T0 + 0.123456, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"pcap1")),
        (T0 + 1.5, "inside", udp_out(SUB_B, 40010, SRV2, 123, b"pcap2")),
        (T0 + 2, "inside", udp_out(SUB_B, 40012, POOL1, 40000, b"to-pool")),
    ]
    outs, rep = replay(h.make_config(), frames, writer=_pcap_writer(nanos))
    o = one(outs, "outside", has_payload(b"pcap1"))
    assert (o.pkt[IP].src, o.pkt[UDP].sport, o.pkt[IP].ttl) == (POOL1, 40000, 63)
    assert abs(o.ts - (T0 + 0.123456)) < 1e-6
    o = one(outs, "outside", has_payload(b"pcap2"))
    assert o.pkt[IP].src == POOL1
    hp = one(outs, "inside", has_payload(b"to-pool"), "hairpinned frame").pkt
    assert (hp[IP].dst, hp[UDP].dport) == (SUB_A, 40000)
    assert rep["packets"]["in_inside"] == 3 and rep["packets"]["in_outside"] == 0, rep["packets"]


def test_pcapng_sides_by_interface_name(replay):
    """Contract: in pcapng, packets on an interface whose if_name is `outside`
    arrive from the outside, all others inside, whatever the interface ids:
    here id 0 is `outside`, id 1 `eth0` (so inside)."""
    frames = [
        (T0, "eth0", udp_out(SUB_A, 40000, SRV1, 53, b"via-eth0")),
        (T0 + 0.1, "outside", udp_in(SRV1, 53, POOL1, 40000, b"via-outside")),
    ]

    def writer(d, fr):
        p = d / "in.pcapng"
        h.write_pcapng(p, fr, ifnames=("outside", "eth0"))
        return p

    outs, rep = replay(h.make_config(), frames, writer=writer)
    o = one(outs, "outside", has_payload(b"via-eth0")).pkt
    assert (o[IP].src, o[UDP].sport) == (POOL1, 40000)
    i = one(outs, "inside", has_payload(b"via-outside")).pkt
    assert (i[IP].dst, i[UDP].dport) == (SUB_A, 40000)
    assert (rep["packets"]["in_inside"], rep["packets"]["in_outside"]) == (1, 1), rep["packets"]


def test_qinq_and_vlan_tags_kept(replay):
    """Contract: frames keep their Ethernet header and 802.1Q tags unchanged
    (here a double-tagged 802.1ad/802.1Q frame outbound and a single-tagged
    reply inbound), while the IPv4 packet is translated."""
    fo = (Ether(src=h.mac_for(SUB_A), dst=h.NAT_IN_MAC, type=0x88A8) / Dot1Q(vlan=10, type=0x8100)
          / Dot1Q(vlan=100) / IP(src=SUB_A, dst=SRV1, ttl=64) / UDP(sport=40000, dport=53) / Raw(b"qinq-out"))
    fi = (Ether(src=h.GW_MAC, dst=h.NAT_OUT_MAC) / Dot1Q(vlan=200, prio=5)
          / IP(src=SRV1, dst=POOL1, ttl=64) / UDP(sport=53, dport=40000) / Raw(b"vl-in"))
    outs, _ = replay(h.make_config(), [(T0, "inside", fo), (T0 + 0.1, "outside", fi)])
    o = one(outs, "outside", has_payload(b"qinq-out"))
    assert o.pkt.original[:22] == bytes(fo)[:22], "Ethernet header / tags changed"
    assert (o.pkt[IP].src, o.pkt[UDP].sport, o.pkt[IP].ttl) == (POOL1, 40000, 63)
    i = one(outs, "inside", has_payload(b"vl-in"))
    assert i.pkt.original[:18] == bytes(fi)[:18], "Ethernet header / tag changed"
    assert (i.pkt[IP].dst, i.pkt[UDP].dport, i.pkt[IP].ttl) == (SUB_A, 40000, 63)


def _time_exceeded_checks(e, trigger, side, src, dst, emb_tuple):
    assert e.side == side, f"time exceeded left on {e.side}, expected {side}"
    t, c, emb = icmp_info(e.pkt)
    assert (t, c) == (11, 0)
    assert (e.pkt[IP].src, e.pkt[IP].dst) == (src, dst)
    assert e.pkt[Ether].src == trigger[Ether].dst and e.pkt[Ether].dst == trigger[Ether].src, \
        "generated frame must carry the trigger's Ethernet addresses swapped"
    assert emb is not None and emb.header_checksum_ok
    assert (emb.src, emb.dst, emb.sport, emb.dport) == emb_tuple
    assert e.pkt[IP].ttl > 1


@pytest.mark.parametrize("outside_addr", [None, "198.51.100.1"])
def test_ttl_decrement_and_time_exceeded(replay, outside_addr):
    """Contract / RFC 1812 sec 5.3.1: every forwarded frame has its TTL
    decremented by one (TTL 2 leaves with 1); a frame arriving with TTL 1 or 0
    is dropped (ttl_expired) and answered with ICMP time exceeded (11/0):
    inside from the inside address, outside from [outside] address or, when
    that is not configured, the first pool address. The error quotes the frame
    as received (untranslated)."""
    cfg = h.make_config(outside={"address": outside_addr + "/24"} if outside_addr else None)
    fr = [
        (T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"ttl2", ttl=2)),
        (T0 + 0.1, "outside", udp_in(SRV1, 53, POOL1, 40000, b"in-ttl2", ttl=2)),
    ]
    t1_in = udp_out(SUB_A, 40000, SRV1, 53, b"ttl1", ttl=1)
    t0_in = udp_out(SUB_A, 40000, SRV1, 53, b"ttl0", ttl=0)
    t1_out = udp_in(SRV1, 53, POOL1, 40000, b"in-ttl1", ttl=1)
    fr += [(T0 + 1, "inside", t1_in), (T0 + 2, "inside", t0_in), (T0 + 3, "outside", t1_out)]
    outs, rep = replay(cfg, fr)
    assert one(outs, "outside", has_payload(b"ttl2")).pkt[IP].ttl == 1
    assert one(outs, "inside", has_payload(b"in-ttl2")).pkt[IP].ttl == 1
    for tag in (b"ttl1", b"ttl0"):
        none_of(outs, "outside", has_payload(tag), "frame with TTL <= 1")
    none_of(outs, "inside", has_payload(b"in-ttl1"), "frame with TTL <= 1")
    errs = pick(outs, None, h.is_icmp_error)
    assert len(errs) == 3, h.dump(outs)
    errs.sort(key=lambda o: o.ts)
    _time_exceeded_checks(errs[0], t1_in, "inside", INSIDE_ADDR, SUB_A, (SUB_A, SRV1, 40000, 53))
    _time_exceeded_checks(errs[1], t0_in, "inside", INSIDE_ADDR, SUB_A, (SUB_A, SRV1, 40000, 53))
    _time_exceeded_checks(errs[2], t1_out, "outside", outside_addr or POOL1, SRV1, (SRV1, POOL1, 53, 40000))
    assert rep["drops"] == {"ttl_expired": 3}, rep["drops"]
    assert rep["packets"]["generated"] == 3
