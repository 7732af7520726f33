"""`natrix check-config --cluster a.toml b.toml ...` (issue #25 item 1):
a cluster's node files held together. Each partition has one active node
and at most one standby alike in subscribers and pool; partitions share no
subscriber or pool address and together cover `[cluster] subscriber_space`
and `pool_space` exactly. Expected overlaps and gaps are computed here with
Python's ipaddress module, not by natrix."""

import ipaddress
import json
import random

import pytest

import natrix_harness as h

SPACE = "100.64.0.0/20"
POOL_SPACE = "203.0.113.0/26"


def node(name, partition, role, subscribers, pool, extra_nat=""):
    subs = ", ".join(f'"{s}"' for s in subscribers)
    pools = ", ".join(f'"{p}"' for p in pool)
    return (
        f'[nat]\npool = [{pools}]\n{extra_nat}'
        f'[cluster]\nnode = "{name}"\npartition = "{partition}"\nrole = "{role}"\n'
        f'subscribers = [{subs}]\nsubscriber_space = ["{SPACE}"]\npool_space = ["{POOL_SPACE}"]\n'
    )


def write(tmp_path, files):
    paths = []
    for name, text in files.items():
        p = tmp_path / f"{name}.toml"
        p.write_text(text)
        paths.append(str(p))
    return paths


def check(natrix, tmp_path, files):
    p = natrix("check-config", "--cluster", *write(tmp_path, files))
    return p.returncode, h.proc_text(p)


def good_cluster():
    """Two partitions splitting the space and the pool in halves; p1 has a standby."""
    return {
        "a1": node("a1", "p1", "active", ["100.64.0.0/21"], ["203.0.113.0/27"]),
        "a2": node("a2", "p1", "standby", ["100.64.0.0/21"], ["203.0.113.0/27"]),
        "b1": node("b1", "p2", "active", ["100.64.8.0/21"], ["203.0.113.32/27"]),
    }


def test_a_cluster_that_covers_its_space_exactly_is_valid(natrix, tmp_path):
    rc, out = check(natrix, tmp_path, good_cluster())
    assert rc == 0, out
    assert "2 partitions, 3 nodes" in out
    assert "partition p1: active" in out and "standby" in out


def test_one_file_without_cluster_is_refused_as_usage(natrix, tmp_path):
    paths = write(tmp_path, good_cluster())
    p = natrix("check-config", *paths[:2])
    assert p.returncode == 2
    assert "--cluster" in h.proc_text(p)


def test_a_file_without_a_cluster_section_is_named(natrix, tmp_path):
    files = good_cluster()
    files["b1"] = '[nat]\npool = ["203.0.113.32/27"]\n'
    rc, out = check(natrix, tmp_path, files)
    assert rc == 2
    assert "b1.toml: no [cluster] section" in out


@pytest.mark.parametrize("change, expected", [
    (lambda f: f.update(a2=f["a2"].replace('"standby"', '"active"')), 'partition "p1" has two active nodes'),
    (lambda f: f.update(a1=f["a1"].replace('"active"', '"standby"')), 'partition "p1" has two standby nodes'),
    (lambda f: f.update(b1=f["b1"].replace('"active"', '"standby"')), 'partition "p2" has no active node'),
    (lambda f: f.update(a2=f["a2"].replace('"203.0.113.0/27"', '"203.0.113.0/28", "203.0.113.16/28"').replace("[nat]\n", '[nat]\nports = "2048-65535"\n')),
     'partition "p1": nat.ports differs between'),
    (lambda f: f.update(b1=f["b1"].replace('node = "b1"', 'node = "a1"')), 'cluster.node "a1" is used by both'),
    (lambda f: f.update(a2="workers = 2\n" + f["a2"]), 'partition "p1": workers differs between'),
    (lambda f: f.update(a1=f["a1"] + 'sync_listen = "192.0.2.1:7400"\nsync_peer = "192.0.2.2:7400"\n',
                        a2=f["a2"] + 'sync_listen = "192.0.2.2:7400"\nsync_peer = "192.0.2.3:7400"\n'),
     'a2.toml do not sync with each other'),
    (lambda f: f.update(a1=f["a1"] + 'sync_listen = "192.0.2.1:7400"\nsync_peer = "192.0.2.2:7400"\n'),
     'do not sync with each other'),
    (lambda f: f.update(b1=f["b1"].replace(f'pool_space = ["{POOL_SPACE}"]', 'pool_space = ["203.0.113.0/25"]')), "cluster.pool_space differs"),
])
def test_partners_and_names_must_agree(natrix, tmp_path, change, expected):
    files = good_cluster()
    change(files)
    rc, out = check(natrix, tmp_path, files)
    assert rc == 2, out
    assert expected in out


def prefixes_in(text):
    """Every IPv4 prefix a message names, as networks."""
    words = text.replace(",", " ").split()
    return {ipaddress.ip_network(w) for w in words if w.count(".") == 3 and "/" in w and w[0].isdigit()}


def problem_lines(out, kind):
    return [l for l in out.splitlines() if f"{kind} " in l and "cluster:" in l]


def expected_gaps(space, owned):
    """The parts of space no owned network covers, collapsed."""
    left = [ipaddress.ip_network(space)]
    for o in owned:
        nxt = []
        for n in left:
            if o.overlaps(n):
                if o.supernet_of(n):
                    continue
                if n.supernet_of(o):
                    nxt.extend(n.address_exclude(o))
                    continue
            nxt.append(n)
        left = nxt
    return set(ipaddress.collapse_addresses(left))


def covered_set(nets):
    out = set()
    for n in nets:
        out |= set(range(int(n.network_address), int(n.broadcast_address) + 1))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_random_partitions_overlaps_and_gaps_are_found_exactly(natrix, tmp_path, seed):
    """Three partitions with random subscriber prefixes (/22 to /24 inside
    the /20) and random pool slices (/28 to /30 inside the /26): natrix's
    overlaps and gaps are exactly those ipaddress computes."""
    rnd = random.Random(seed)
    space, pool_space = ipaddress.ip_network(SPACE), ipaddress.ip_network(POOL_SPACE)

    def pick(within, lo, hi, count):
        nets = []
        while len(nets) < count:
            n = rnd.choice(list(within.subnets(new_prefix=rnd.randint(lo, hi))))
            if not any(n.overlaps(m) for m in nets):
                nets.append(n)
        return nets

    subs = {p: pick(space, 22, 24, 2) for p in ("p1", "p2", "p3")}
    pools = {p: pick(pool_space, 28, 30, 2) for p in ("p1", "p2", "p3")}
    files = {p: node(p, p, "active", [str(n) for n in subs[p]], [str(n) for n in pools[p]]) for p in subs}
    rc, out = check(natrix, tmp_path, files)

    for kind, nets, whole in (("subscriber", subs, space), ("pool", pools, pool_space)):
        owned = [n for v in nets.values() for n in v]
        gaps = expected_gaps(whole, owned)
        gap_lines = problem_lines(out, f"{kind} gap:")
        if gaps:
            assert len(gap_lines) == 1, out
            named = prefixes_in(gap_lines[0].split("gap:")[1])
            if "more prefixes" not in gap_lines[0]:
                assert covered_set(named) == covered_set(gaps), out
            else:
                assert covered_set(named) <= covered_set(gaps), out
        else:
            assert not gap_lines, out
        for a, b in (("p1", "p2"), ("p1", "p3"), ("p2", "p3")):
            both = covered_set(nets[a]) & covered_set(nets[b])
            lines = [l for l in problem_lines(out, f"{kind} overlap:") if f'"{a}" and "{b}"' in l]
            if both:
                assert len(lines) == 1, out
                assert covered_set(prefixes_in(lines[0].split("own")[1])) == both, out
            else:
                assert not lines, out
    any_problem = "gap:" in out or "overlap:" in out
    assert (rc == 2) == any_problem, out


DET = '''[nat]
mode = "deterministic"
pool = ["{pool}"]
subscribers = ["{subs}"]
ports_per_subscriber = {per}
[cluster]
node = "{name}"
partition = "{part}"
role = "{role}"
subscriber_space = ["100.64.0.0/23"]
pool_space = ["203.0.113.0/29"]
'''


def det_cluster(per_b2=1008):
    return {
        "a1": DET.format(pool="203.0.113.0/30", subs="100.64.0.0/24", per=1008, name="a1", part="p1", role="active"),
        "a2": DET.format(pool="203.0.113.0/30", subs="100.64.0.0/24", per=1008, name="a2", part="p1", role="standby"),
        "b1": DET.format(pool="203.0.113.4/30", subs="100.64.1.0/24", per=1008, name="b1", part="p2", role="active"),
        "b2": DET.format(pool="203.0.113.4/30", subs="100.64.1.0/24", per=per_b2, name="b2", part="p2", role="standby"),
    }


def test_deterministic_partners_must_share_the_formula(natrix, tmp_path):
    rc, out = check(natrix, tmp_path, det_cluster())
    assert rc == 0, out
    rc, out = check(natrix, tmp_path, det_cluster(per_b2=504))
    assert rc == 2
    assert 'partition "p2": the deterministic formula' in out


def test_whois_answers_across_a_deterministic_cluster_and_after_failover(natrix, tmp_path):
    """Each pool address is answered by its own partition's formula, with a
    subscriber of that partition, and the standby's file gives the same answer."""
    paths = dict(zip(["a1", "a2", "b1", "b2"], write(tmp_path, det_cluster())))
    rnd = random.Random(25)
    for _ in range(6):
        addr = f"203.0.113.{rnd.randrange(8)}"
        port = rnd.randrange(1024, 65536)
        configs = [arg for path in paths.values() for arg in ("--config", path)]
        p = natrix("whois", "--proto", "udp", "--json", *configs, f"{addr}:{port}")
        doc = json.loads(p.stdout.decode())
        assert doc["held"], doc
        standby = paths["a2"] if int(addr.rsplit(".", 1)[1]) < 4 else paths["b2"]
        q = natrix("whois", f"{addr}:{port}", "--proto", "udp", "--json", "--config", standby)
        assert json.loads(q.stdout.decode())["answers"] == doc["answers"]
        owner = ipaddress.ip_network("100.64.0.0/24" if int(addr.rsplit(".", 1)[1]) < 4 else "100.64.1.0/24")
        for a in doc["answers"]:
            assert ipaddress.ip_address(a["subscriber"]) in owner, doc
