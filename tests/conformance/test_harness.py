"""Self-tests of the harness (no natrix binary needed): the pcapng writer and
reader round-trip and agree with scapy's own pcapng implementation, and the
independent checksum verifier rejects corrupted packets."""

import struct

import pytest
from scapy.utils import PcapNgReader, PcapNgWriter, rdpcap

import natrix_harness as h
from natrix_harness import ICMP, IP, TCP, UDP, Dot1Q, Ether, Raw


def _frames():
    return [
        (1000.0, "inside", h.udp_out(h.SUB_A, 40000, h.SRV1, 53, b"abc")),
        (1000.25, "outside", h.udp_in(h.SRV1, 53, h.POOL1, 40000, b"defgh")),
        (1000.5, "inside", h.tcp_out(h.SUB_A, 40001, h.SRV1, 80, "S", seq=7)),
        (1001.000001, "outside", h.echo_reply_in(h.SRV1, h.POOL1, 9)),
    ]


def test_pcapng_roundtrip_own_reader(tmp_path):
    """Our writer and reader agree: sides, timestamps (us) and bytes."""
    p = tmp_path / "x.pcapng"
    frames = _frames()
    h.write_pcapng(p, frames)
    assert h.read_pcapng_interfaces(p) == ["inside", "outside"]
    back = h.read_pcapng(p)
    assert len(back) == len(frames)
    for (ts, side, pkt), (ts2, side2, raw) in zip(frames, back):
        assert side == side2
        assert abs(ts - ts2) < 1e-6
        assert bytes(pkt) == raw


def test_pcapng_readable_by_scapy(tmp_path):
    """scapy's pcapng reader accepts our file and sees the same packets,
    timestamps and interface names."""
    p = tmp_path / "x.pcapng"
    frames = _frames()
    h.write_pcapng(p, frames)
    pkts = rdpcap(str(p))
    assert len(pkts) == len(frames)
    for (ts, side, pkt), sp in zip(frames, pkts):
        assert bytes(sp) == bytes(pkt)
        assert abs(float(sp.time) - ts) < 1e-6
    with PcapNgReader(str(p)) as r:
        names = [getattr(sp, "sniffed_on", None) for sp in r]
    if any(n is not None for n in names):
        assert names == [s for _, s, _ in frames]


def test_reader_accepts_scapy_written_pcapng(tmp_path):
    """Our reader decodes a pcapng written by scapy (independent writer)."""
    p = tmp_path / "s.pcapng"
    w = PcapNgWriter(str(p))
    frames = _frames()
    for ts, side, pkt in frames:
        pkt = pkt.copy()
        pkt.time = ts
        pkt.sniffed_on = side
        w.write(pkt)
    w.close()
    back = h.read_pcapng(p)
    assert [b[1] for b in back] == [f[1] for f in frames]
    assert [b[2] for b in back] == [bytes(f[2]) for f in frames]
    for (ts, _, _), (ts2, _, _) in zip(frames, back):
        assert abs(ts - ts2) < 1e-5


def test_reader_nanosecond_resolution(tmp_path):
    """if_tsresol (option 9) = 9 is honoured."""
    raw = bytes(h.udp_out(h.SUB_A, 1, h.SRV1, 2))
    shb = h._block(h.SHB_TYPE, struct.pack("<IHHq", h.BYTE_ORDER_MAGIC, 1, 0, -1))
    opts = h._option(2, b"outside") + h._option(9, bytes([9])) + struct.pack("<HH", 0, 0)
    idb = h._block(h.IDB_TYPE, struct.pack("<HHI", 1, 0, 0) + opts)
    ticks = 1234_567891234
    epb = h._block(h.EPB_TYPE, struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(raw), len(raw)) + raw)
    p = tmp_path / "ns.pcapng"
    p.write_bytes(shb + idb + epb)
    (ts, side, data), = h.read_pcapng(p)
    assert side == "outside" and data == raw
    assert abs(ts - 1234.567891234) < 1e-9


def test_checksum_verifier_accepts_good_packets():
    for _, _, pkt in _frames():
        h.verify_frame_checksums(bytes(pkt))
    h.verify_frame_checksums(bytes(h.udp_out(h.SUB_A, 1, h.SRV1, 2, chksum=0)))
    v = Ether() / Dot1Q(vlan=7) / IP(src="1.2.3.4", dst="5.6.7.8") / UDP() / Raw(b"x")
    h.verify_frame_checksums(bytes(v))
    emb = bytes(IP(src="1.2.3.4", dst="5.6.7.8") / UDP(sport=1, dport=2) / Raw(b"zz"))
    h.verify_frame_checksums(bytes(h.icmp_error(Ether(), "5.6.7.8", "1.2.3.4", emb)))


@pytest.mark.parametrize("which", ["ip", "udp", "tcp", "icmp", "embedded_ip"])
def test_checksum_verifier_rejects_bad_packets(which):
    if which == "ip":
        pkt = Ether() / IP(src="1.2.3.4", dst="5.6.7.8", chksum=0x1234) / UDP() / Raw(b"x")
    elif which == "udp":
        pkt = Ether() / IP(src="1.2.3.4", dst="5.6.7.8") / UDP(chksum=0x1234) / Raw(b"x")
    elif which == "tcp":
        pkt = Ether() / IP(src="1.2.3.4", dst="5.6.7.8") / TCP(chksum=0x1234)
    elif which == "icmp":
        pkt = Ether() / IP(src="1.2.3.4", dst="5.6.7.8") / ICMP(chksum=0x1234)
    else:
        emb = bytearray(bytes(IP(src="1.2.3.4", dst="5.6.7.8") / UDP(sport=1, dport=2)))
        emb[10] ^= 0xFF
        pkt = h.icmp_error(Ether(), "5.6.7.8", "1.2.3.4", bytes(emb))
    with pytest.raises(AssertionError):
        h.verify_frame_checksums(bytes(pkt))


def test_config_builder_is_valid_toml():
    try:
        import tomllib
    except ImportError:  # pragma: no cover
        pytest.skip("tomllib needs python 3.11")
    text = h.make_config(
        pool=[h.POOL28], nat={"filtering": "address-dependent", "port_parity": False,
                              "static": [{"proto": "tcp", "inside": "100.64.0.5:22", "outside": "203.0.113.1:2222"}],
                              "max_ports_per_protocol": {"tcp": 5}},
        timeouts={"udp": "2m"})
    d = tomllib.loads(text)
    assert d["nat"]["pool"] == [h.POOL28]
    assert d["nat"]["static"][0]["inside"] == "100.64.0.5:22"
    assert d["timeouts"]["udp"] == "2m"


def test_verifier_checks_embedded_transport_checksum():
    """A complete embedded datagram with a wrong UDP checksum is rejected; a
    truncated one (RFC 792: header + 8 bytes) or one with checksum 0 is not."""
    good = bytes(IP(src="1.2.3.4", dst="5.6.7.8") / UDP(sport=1, dport=2) / Raw(b"payload"))
    bad = bytearray(good)
    bad[26] ^= 0x01
    with pytest.raises(AssertionError):
        h.verify_frame_checksums(bytes(h.icmp_error(Ether(), "5.6.7.8", "1.2.3.4", bytes(bad))))
    h.verify_frame_checksums(bytes(h.icmp_error(Ether(), "5.6.7.8", "1.2.3.4", bytes(bad[:28]))))
    zero = bytes(IP(src="1.2.3.4", dst="5.6.7.8") / UDP(sport=1, dport=2, chksum=0) / Raw(b"payload"))
    h.verify_frame_checksums(bytes(h.icmp_error(Ether(), "5.6.7.8", "1.2.3.4", zero)))


def test_fragment_verifier():
    """Complete output fragment sets are reassembled and their transport
    checksum verified; a corrupted piece is caught, an incomplete set skipped."""
    from scapy.all import fragment
    d = IP(src="1.2.3.4", dst="5.6.7.8", id=9) / UDP(sport=1, dport=2) / Raw(bytes(range(256)) * 6)
    frs = [("outside", bytes(Ether() / f)) for f in fragment(d, fragsize=512)]
    assert len(frs) == 4
    h.verify_output_fragments(frs)
    bad = bytearray(frs[2][1])
    bad[-1] ^= 0xFF
    with pytest.raises(AssertionError):
        h.verify_output_fragments(frs[:2] + [("outside", bytes(bad))] + frs[3:])
    h.verify_output_fragments(frs[:2] + [("outside", bytes(bad))])  # incomplete: not checked


def test_pcap_writer_readable_by_scapy(tmp_path):
    for nanos in (False, True):
        p = tmp_path / f"x{nanos}.pcap"
        frames = _frames()
        h.write_pcap(p, frames, nanos=nanos)
        pkts = rdpcap(str(p))
        assert [bytes(x) for x in pkts] == [bytes(f[2]) for f in frames]
        for (ts, _, _), sp in zip(frames, pkts):
            assert abs(float(sp.time) - ts) < 1e-6
