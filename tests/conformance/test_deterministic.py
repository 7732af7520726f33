"""Deterministic NAT (RFC 7422; CONTRACTS "Config keys" and "Operations (#6)").

With `[nat] mode = "deterministic"`, subscriber number i (counting addresses
through `subscribers` in the order configured) owns, on pool address
pool[i // per_address] (pool addresses ascending), the ports
lo + k*N .. lo + (k+1)*N - 1 with k = i % per_address, per_address =
(hi - lo + 1) // N. The formula is computed here independently, with
Python's ipaddress module, and every translated frame is checked against it.
"""

import ipaddress

import pytest

import natrix_harness as h
from natrix_harness import ICMP, IP, SRV1, T0, TCP, UDP, has_payload, one, pick

SUBNETS = ["100.64.0.0/26", "100.64.1.0/27"]  # 64 + 32 = 96 subscribers
POOL = "203.0.113.0/31"                       # 2 addresses
N = 1008                                      # 64512 // 1008 = 64 ranges per address: room for 128


def det_nat(subscribers=SUBNETS, n=N, **extra):
    nat = {"mode": "deterministic", "subscribers": list(subscribers), "ports_per_subscriber": n}
    nat.update(extra)
    return nat


def det_config(pool=(POOL,), **kw):
    return h.make_config(pool=pool, nat=det_nat(**kw))


def subscribers(subnets=SUBNETS):
    """Every subscriber address, in the formula's order."""
    return [str(a) for net in subnets for a in ipaddress.ip_network(net)]


def formula(index, pool=POOL, lo=1024, hi=65535, n=N):
    addrs = [str(a) for a in ipaddress.ip_network(pool)]
    per_address = (hi - lo + 1) // n
    k = index % per_address
    return addrs[index // per_address], lo + k * n, lo + (k + 1) * n - 1


def test_every_subscriber_translates_inside_its_formula_range(replay):
    subs = subscribers()
    chosen = sorted(set(range(0, len(subs), 7)) | {2, 63, 64, 95})
    frames = []
    t = T0
    expected = {}
    for i in chosen:
        sub = subs[i]
        addr, first, last = formula(i)
        expected[sub] = (addr, first, last)
        # A source port inside the range, two outside it (one odd), TCP and ICMP.
        for sport in (first + 11, 40000, 53):
            t += 0.001
            frames.append((t, "inside", h.udp_out(sub, sport, SRV1, 53, f"u{i}-{sport}".encode())))
        t += 0.001
        frames.append((t, "inside", h.tcp_out(sub, 50001, SRV1, 443, flags="S", seq=i)))
        t += 0.001
        frames.append((t, "inside", h.echo_out(sub, SRV1, ident=7, seq=i)))
    outs, rep = replay(det_config(), frames)
    assert rep["drops"] == {}, rep["drops"]
    for i in chosen:
        sub = subs[i]
        addr, first, last = expected[sub]
        for sport in (first + 11, 40000, 53):
            p = one(outs, "outside", has_payload(f"u{i}-{sport}".encode())).pkt
            assert p[IP].src == addr, f"subscriber {i} ({sub}) left as {p[IP].src}, formula says {addr}"
            assert first <= p[UDP].sport <= last, f"subscriber {i}: port {p[UDP].sport} outside {first}-{last}"
            assert p[UDP].sport % 2 == sport % 2, "port parity is kept inside the range"
            if sport == first + 11:
                assert p[UDP].sport == sport, "a source port inside the range is preserved"
        syn = one(outs, "outside", lambda p, i=i: h.is_tcp(p) and p[TCP].seq == i and p[TCP].dport == 443).pkt
        assert syn[IP].src == addr and first <= syn[TCP].sport <= last
        echo = one(outs, "outside", lambda p, i=i: h.is_icmp(p) and p[ICMP].type == 8 and p[ICMP].seq == i).pkt
        assert echo[IP].src == addr and first <= echo[ICMP].id <= last, "ICMP identifiers use the same range"
    assert rep["log_volume"]["deterministic"]["records"] == 0


def test_replies_come_back_to_the_subscriber(replay):
    subs = subscribers()
    addr, first, _ = formula(70)
    s = h.Scenario(replay, det_config())
    s.add(T0, "inside", h.udp_out(subs[70], first + 3, SRV1, 53, b"q"))
    s.add(T0 + 0.1, "outside", h.udp_in(SRV1, 53, addr, first + 3, b"answer"))
    outs, _ = s.run()
    back = one(outs, "inside", has_payload(b"answer")).pkt
    assert (back[IP].dst, back[UDP].dport) == (subs[70], first + 3)


def test_a_source_outside_the_subscribers_is_refused(replay):
    frames = [
        (T0, "inside", h.udp_out("100.64.2.5", 40000, SRV1, 53, b"stranger")),
        (T0 + 0.1, "inside", h.udp_out("100.64.1.32", 40000, SRV1, 53, b"just-past-the-second-prefix")),
        (T0 + 0.2, "inside", h.udp_out("100.64.1.31", 40000, SRV1, 53, b"last-subscriber")),
    ]
    outs, rep = replay(det_config(), frames)
    assert not pick(outs, "outside", has_payload(b"stranger"))
    assert not pick(outs, "outside", has_payload(b"just-past-the-second-prefix"))
    p = one(outs, "outside", has_payload(b"last-subscriber")).pkt
    addr, first, last = formula(95)
    assert p[IP].src == addr and first <= p[UDP].sport <= last
    assert rep["drops"] == {"not_subscriber": 2}, rep["drops"]


def test_a_full_range_is_the_subscribers_limit(replay):
    """With 4 ports each, a subscriber's fifth UDP mapping is refused (port
    quota, ICMP host unreachable) while its neighbour still gets its own range."""
    cfg = h.make_config(pool=("203.0.113.1/32",), nat=det_nat(subscribers=["100.64.0.0/28"], n=4, ports="1024-1087"))
    frames = [(T0 + k * 0.01, "inside", h.udp_out("100.64.0.10", 40000 + k, SRV1, 53, f"m{k}".encode())) for k in range(5)]
    frames.append((T0 + 1, "inside", h.udp_out("100.64.0.11", 40000, SRV1, 53, b"neighbour")))
    outs, rep = replay(cfg, frames)
    ports = sorted(one(outs, "outside", has_payload(f"m{k}".encode())).pkt[UDP].sport for k in range(4))
    assert ports == [1024 + 40, 1025 + 40, 1026 + 40, 1027 + 40], ports
    assert not pick(outs, "outside", has_payload(b"m4"))
    assert rep["drops"] == {"port_quota": 1}, rep["drops"]
    errs = pick(outs, "inside", h.is_icmp_error)
    assert len(errs) == 1 and h.icmp_info(errs[0].pkt)[:2] == (3, 1)
    n = one(outs, "outside", has_payload(b"neighbour")).pkt
    assert 1024 + 44 <= n[UDP].sport <= 1024 + 47


def _check(natrix, tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    proc = natrix("check-config", p)
    return proc.returncode, h.proc_text(proc)


def test_check_config_accepts_arithmetic_that_fits(natrix, tmp_path):
    rc, out = _check(natrix, tmp_path, det_config())
    assert rc == 0, out


@pytest.mark.parametrize("subnets,pool,n,ports,capacity", [
    (["100.64.0.0/22"], POOL, 1008, None, 128),          # 1024 subscribers, 2 x 64 ranges
    (["100.64.0.0/24", "100.64.4.0/24"], "203.0.113.0/30", 2000, None, 128),   # 512 > 4 x 32
    (["100.64.0.0/26"], "203.0.113.1/32", 100, "1024-5023", 40),   # 64 > 4000 // 100
])
def test_check_config_refuses_arithmetic_that_does_not_fit_and_says_how_many_fit(natrix, tmp_path, subnets, pool, n, ports, capacity):
    extra = {"ports": ports} if ports else {}
    rc, out = _check(natrix, tmp_path, h.make_config(pool=(pool,), nat=det_nat(subscribers=subnets, n=n, **extra)))
    assert rc != 0, out
    assert "subscribers" in out, out
    assert f"hold {capacity} subscribers" in out, f"the message must say the pool can hold {capacity}:\n{out}"


@pytest.mark.parametrize("case,nat,word", [
    ("range larger than the port range", det_nat(n=70000), "ports_per_subscriber"),
    ("no subscribers", {"mode": "deterministic", "ports_per_subscriber": N}, "subscribers"),
    ("no range size", {"mode": "deterministic", "subscribers": SUBNETS}, "ports_per_subscriber"),
    ("overlapping prefixes", det_nat(subscribers=["100.64.0.0/24", "100.64.0.128/25"]), "subscribers"),
    ("subscribers in dynamic mode", {"subscribers": SUBNETS}, "subscribers"),
    ("port blocks in deterministic mode", det_nat(port_block_size=64), "port_block_size"),
    ("bad prefix", det_nat(subscribers=["100.64.0.1/24"]), "subscribers"),
])
def test_check_config_refuses_inconsistent_deterministic_settings(natrix, tmp_path, case, nat, word):
    rc, out = _check(natrix, tmp_path, h.make_config(pool=(POOL,), nat=nat))
    assert rc != 0, f"{case}: accepted\n{out}"
    assert word in out, f"{case}: message does not name {word!r}:\n{out}"


def test_a_static_mapping_inside_a_subscribers_range_is_refused(natrix, tmp_path):
    addr, first, _ = formula(5)
    other = subscribers()[6]
    nat = det_nat(static=[{"proto": "tcp", "inside": f"{other}:22", "outside": f"{addr}:{first}"}])
    rc, out = _check(natrix, tmp_path, h.make_config(pool=(POOL,), nat=nat))
    assert rc != 0 and "static" in out, out
