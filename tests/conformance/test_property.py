"""Property-style round trip (seeded random loop, no extra dependency):
random UDP, TCP and ICMP echo flows from random subscribers, source ports and
identifiers (collisions, ports below the dynamic range, odd payload lengths,
zero UDP checksums, IP options) are translated out, answered by the servers
and translated back. Properties (RFC 4787 REQ-1/2/3/4, RFC 5382, RFC 5508,
contract):

- outbound: destination, payload, TCP seq/ack/flags/window, ICMP seq unchanged;
  TTL - 1; source address from the pool, one address per subscriber;
  UDP/TCP external port in range with the source port's parity;
- the same internal endpoint always gets the same external endpoint (EIM),
  two different internal endpoints never share one (no overloading);
- replies come back with exactly the original headers (addresses,
  ports/identifier), payload intact, zero UDP checksum kept zero;
- every frame's checksums are valid (the harness checks every output frame).
"""

import os
import random

import pytest

import natrix_harness as h
from natrix_harness import ICMP, IP, POOL28, T0, TCP, UDP, Ether, Raw, in_net

SERVERS = ["198.51.100.20", "198.51.100.21", "192.0.2.30", "198.51.100.99"]
IPOPT_NOP4 = b"\x01\x01\x01\x00"  # NOP NOP NOP EOL: 4 bytes of IPv4 options
FLOWS = int(os.environ.get("NATRIX_PROPERTY_FLOWS", "70"))  # flows per case; raise for a longer soak


def _ip(src, dst, rng_opts, **kw):
    if rng_opts:
        return IP(src=src, dst=dst, ttl=64, options=[IPOPT_NOP4], **kw)
    return IP(src=src, dst=dst, ttl=64, **kw)


def _flows(seed, n=FLOWS):
    rng = random.Random(seed)
    subs = [f"100.64.{3 + seed % 5}.{10 + i}" for i in range(9)]
    flows = []
    used = set()
    for i in range(n):
        proto = rng.choice(["udp", "udp", "tcp", "icmp"])
        # re-use an existing internal endpoint sometimes (EIM towards another server)
        if flows and rng.random() < 0.2:
            base = rng.choice([f for f in flows if f["proto"] == proto] or [None])
        else:
            base = None
        if base:
            sub, sport = base["sub"], base["sport"]
        else:
            sub = rng.choice(subs)
            r = rng.random()
            if r < 0.3:
                sport = rng.choice([40000, 40001, 5353, 1025])      # collisions between subscribers
            elif r < 0.4:
                sport = rng.choice([53, 123, 500, 0 if proto == "icmp" else 1023])  # below the range
            else:
                sport = rng.randrange(1024, 65536)
        dst = rng.choice(SERVERS)
        dport = rng.choice([53, 80, 443, 3478, rng.randrange(1, 65536)])
        key = (proto, sub, sport, dst, dport)
        if key in used:
            continue
        used.add(key)
        flows.append({
            "i": len(flows), "proto": proto, "sub": sub, "sport": sport, "dst": dst, "dport": dport,
            "payload": bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300))),
            "reply": bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300))),
            "zero_ck": proto == "udp" and rng.random() < 0.2,
            "opts": rng.random() < 0.2,
        })
    return flows


def _tag(f, d):
    return b"%s%03d|" % (d, f["i"])


def _out_frame(f):
    payload = _tag(f, b"O") + f["payload"]
    ip = _ip(f["sub"], f["dst"], f["opts"], id=f["i"] + 1)
    eth = h.eth_in(f["sub"])
    if f["proto"] == "udp":
        u = UDP(sport=f["sport"], dport=f["dport"], chksum=0) if f["zero_ck"] else UDP(sport=f["sport"], dport=f["dport"])
        return eth / ip / u / Raw(payload)
    if f["proto"] == "tcp":
        return eth / ip / TCP(sport=f["sport"], dport=f["dport"], flags="S", seq=10_000 + f["i"], window=4321,
                              options=[("MSS", 1400), ("NOP", None), ("WScale", 7)]) / Raw(payload)
    return eth / ip / ICMP(type=8, id=f["sport"], seq=f["i"]) / Raw(payload)


def _in_frame(f, ext_addr, ext_port):
    payload = _tag(f, b"I") + f["reply"]
    ip = _ip(f["dst"], ext_addr, f["opts"], id=f["i"] + 1000)
    eth = h.eth_out()
    if f["proto"] == "udp":
        u = UDP(sport=f["dport"], dport=ext_port, chksum=0) if f["zero_ck"] else UDP(sport=f["dport"], dport=ext_port)
        return eth / ip / u / Raw(payload)
    if f["proto"] == "tcp":
        return eth / ip / TCP(sport=f["dport"], dport=ext_port, flags="SA", seq=90_000 + f["i"],
                              ack=10_001 + f["i"], window=1234) / Raw(payload)
    return eth / ip / ICMP(type=0, id=ext_port, seq=f["i"]) / Raw(payload)


def _find(outs, side, tag):
    got = []
    for o in outs:
        if o.side != side or IP not in o.pkt:
            continue
        if h.l4_data(o.pkt).startswith(tag):
            got.append(o)
    assert len(got) == 1, f"expected one frame tagged {tag!r} on {side}, got {len(got)}\n{h.dump(outs)}"
    return got[0].pkt


def _l4(p):
    return p[UDP] if UDP in p else p[TCP] if TCP in p else p[ICMP]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("selection", ["preserve", "random"])
def test_random_flows_round_trip(replay, seed, selection):
    flows = _flows(seed)
    cfg = h.make_config(pool=[POOL28], nat={"port_selection": selection, "seed": seed})
    frames = [(T0 + k * 0.01, "inside", _out_frame(f)) for k, f in enumerate(flows)]
    outs, rep = replay(cfg, frames)
    assert rep["drops"] == {}, rep["drops"]

    ext = {}           # (proto, sub, sport) -> (addr, port)
    owner = {}         # (proto, addr, port) -> (sub, sport)
    sub_addr = {}
    for f in flows:
        p = _find(outs, "outside", _tag(f, b"O"))
        sent = _out_frame(f)
        where = f"flow {f}"
        assert p[IP].dst == f["dst"] and p[IP].ttl == 63, where
        assert in_net(p[IP].src, POOL28), where
        assert sub_addr.setdefault(f["sub"], p[IP].src) == p[IP].src, f"paired pooling broken: {where}"
        assert h.l4_data(p) == h.l4_data(sent), where
        l4 = _l4(p)
        if f["proto"] == "icmp":
            port = l4.id
            assert (l4.type, l4.code, l4.seq) == (8, 0, f["i"]), where
        else:
            port = l4.sport
            assert l4.dport == f["dport"], where
            assert 1024 <= port <= 65535, f"external port {port} outside 1024-65535: {where}"
            assert port % 2 == f["sport"] % 2, f"parity not kept ({f['sport']} -> {port}): {where}"
            if (selection == "preserve" and f["sport"] >= 1024
                    and (f["proto"], f["sub"], f["sport"]) not in ext
                    and (f["proto"], p[IP].src, f["sport"]) not in owner):
                # a new mapping whose source port is free on its address: preserved (contract)
                assert port == f["sport"], f"free source port not preserved: {where}"
        if f["proto"] == "tcp":
            assert (l4.seq, l4.ack, str(l4.flags), l4.window) == (10_000 + f["i"], 0, "S", 4321), where
            assert bytes(l4)[20:28] == bytes(sent[TCP])[20:28], f"TCP options changed: {where}"
        if f["proto"] == "udp" and f["zero_ck"]:
            assert l4.chksum == 0, f"zero UDP checksum not kept: {where}"
        k = (f["proto"], f["sub"], f["sport"])
        e = (p[IP].src, port)
        assert ext.setdefault(k, e) == e, f"endpoint-independent mapping broken for {k}: {ext[k]} then {e}"
        o = (f["proto"],) + e
        assert owner.setdefault(o, (f["sub"], f["sport"])) == (f["sub"], f["sport"]), \
            f"port overloading: {o} used by {owner[o]} and {(f['sub'], f['sport'])}"

    t = T0 + len(flows) * 0.01 + 1
    for k, f in enumerate(flows):
        a, port = ext[(f["proto"], f["sub"], f["sport"])]
        frames.append((t + k * 0.01, "outside", _in_frame(f, a, port)))
    outs, rep = replay(cfg, frames)
    assert rep["drops"] == {}, rep["drops"]
    for f in flows:
        p = _find(outs, "inside", _tag(f, b"I"))
        where = f"reply of flow {f}"
        assert (p[IP].src, p[IP].dst, p[IP].ttl) == (f["dst"], f["sub"], 63), where
        l4 = _l4(p)
        if f["proto"] == "icmp":
            assert (l4.type, l4.id, l4.seq) == (0, f["sport"], f["i"]), where
        else:
            assert (l4.sport, l4.dport) == (f["dport"], f["sport"]), where
        if f["proto"] == "tcp":
            assert (l4.seq, l4.ack, str(l4.flags), l4.window) == (90_000 + f["i"], 10_001 + f["i"], "SA", 1234), where
        if f["proto"] == "udp" and f["zero_ck"]:
            assert l4.chksum == 0, f"zero UDP checksum not kept: {where}"
        assert h.l4_data(p) == _tag(f, b"I") + f["reply"], where
        if f["opts"]:
            assert (p[IP].ihl, bytes(p[IP])[20:24]) == (6, IPOPT_NOP4), f"IP options changed: {where}"
