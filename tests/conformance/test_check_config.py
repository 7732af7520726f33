"""`natrix check-config FILE` and config errors in `natrix replay` (issue #3
item 9, contract: "exit 0 if valid, else non-zero and prints the key and the
problem"; every key has a default, so a pool alone is a valid config)."""

import pytest

import natrix_harness as h
from natrix_harness import POOL1, SRV1, SUB_A, T0, has_payload, one, udp_out

MINIMAL = '[nat]\npool = ["203.0.113.1/32"]\n'

FULL = '''
[inside]
interface = "eth1"
address = "100.64.0.1/10"
[outside]
interface = "eth2"
address = "198.51.100.1/24"
gateway = "198.51.100.254"
[nat]
pool = ["203.0.113.0/28", "198.51.100.10/32"]
ports = "1024-65535"
filtering = "address-dependent"
max_ports_per_subscriber = 2000
max_ports_per_protocol = { tcp = 2000, udp = 2000, icmp = 2000 }
max_new_mappings_per_second = 0
max_sessions_per_subscriber = 10000
port_block_size = 0
hold_down = "120s"
port_selection = "random"
port_parity = true
inbound_refresh = false
unsolicited_syn = "drop"
exhaustion_icmp = "admin-prohibited"
icmp_errors_per_second = 100
exempt = ["192.0.2.0/24", "198.51.100.53/32:53", "203.0.113.64/26:8000-8080"]
static = [{ proto = "tcp", inside = "100.64.0.5:22", outside = "203.0.113.1:2222" }]
seed = 1
[timeouts]
udp = "5m"
tcp_established = "2h4m"
tcp_transitory = "4m"
icmp = "60s"
fragment = "5s"
[fragments]
max_held = 256
max_held_bytes = 1048576
'''


def _write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_minimal_config_valid(natrix, tmp_path):
    """A config with only [nat] pool is valid (every other key has a default)."""
    p = natrix("check-config", _write(tmp_path, MINIMAL))
    assert p.returncode == 0, h.proc_text(p)


def test_full_contract_config_valid(natrix, tmp_path):
    """Every key the contract lists, with non-default values, is accepted."""
    p = natrix("check-config", _write(tmp_path, FULL))
    assert p.returncode == 0, h.proc_text(p)


def test_example_config_valid(natrix):
    cfg = h.REPO_ROOT / "examples" / "natrix.toml"
    if not cfg.exists():
        pytest.skip("no example config")
    p = natrix("check-config", cfg)
    assert p.returncode == 0, h.proc_text(p)


BAD = [
    # (case, config text, a word the message must contain)
    ("unknown key", MINIMAL + "bogus_key = 1\n", "bogus_key"),
    ("unknown section", MINIMAL + "[bogus_section]\nx = 1\n", "bogus_section"),
    ("missing pool", "[nat]\nports = \"1024-65535\"\n", "pool"),
    ("empty file (no pool)", "", "pool"),
    ("pool prefix /33", '[nat]\npool = ["203.0.113.0/33"]\n', "pool"),
    ("pool not an address", '[nat]\npool = ["203.0.113.300/32"]\n', "pool"),
    ("pool not a list of strings", "[nat]\npool = 5\n", "pool"),
    ("bad duration", MINIMAL + '[timeouts]\nudp = "5 fortnights"\n', "udp"),
    ("bad duration hold_down", MINIMAL + 'hold_down = "soon"\n', "hold_down"),
    ("bad filtering", MINIMAL + 'filtering = "full-cone"\n', "filtering"),
    ("ports reversed", MINIMAL + 'ports = "2000-1000"\n', "ports"),
    ("ports beyond 65535", MINIMAL + 'ports = "1024-70000"\n', "ports"),
    ("bad port_selection", MINIMAL + 'port_selection = "sequential"\n', "port_selection"),
    ("bad exhaustion_icmp", MINIMAL + 'exhaustion_icmp = "loud"\n', "exhaustion_icmp"),
    ("bad unsolicited_syn", MINIMAL + 'unsolicited_syn = "maybe"\n', "unsolicited_syn"),
    ("wrong type", MINIMAL + 'max_ports_per_subscriber = "many"\n', "max_ports_per_subscriber"),
    ("bad exempt", MINIMAL + 'exempt = ["192.0.2.0/24:99999"]\n', "exempt"),
    ("bad static", MINIMAL + 'static = [{ proto = "tcp", inside = "100.64.0.5", outside = "203.0.113.1:2222" }]\n',
     "static"),
    ("bad inside address", '[inside]\naddress = "100.64.0.1/99"\n' + MINIMAL, "address"),
    ("empty pool", "[nat]\npool = []\n", "pool"),
    ("static endpoint mapped twice (port overloading, RFC 4787 REQ-3)",
     MINIMAL + 'static = [{ proto = "udp", inside = "100.64.0.5:53", outside = "203.0.113.1:5353" }, '
               '{ proto = "udp", inside = "100.64.0.6:53", outside = "203.0.113.1:5353" }]\n', "static"),
    ("more static subscribers than max_subscribers, which replay and run refuse",
     MINIMAL + 'max_subscribers = 1\nstatic = [{ proto = "udp", inside = "100.64.0.5:53", outside = "203.0.113.1:5353" }, '
               '{ proto = "udp", inside = "100.64.0.6:53", outside = "203.0.113.1:5354" }]\n', "max_subscribers"),
    ("toml syntax error", "[nat\npool = [\n", None),
]


@pytest.mark.parametrize("case,text,word", BAD, ids=[b[0] for b in BAD])
def test_invalid_config_refused(natrix, tmp_path, case, text, word):
    """Invalid configs are refused: non-zero exit, and the message names the
    offending key."""
    p = natrix("check-config", _write(tmp_path, text))
    out = h.proc_text(p)
    assert p.returncode != 0, f"{case}: accepted\n{out}"
    if word:
        assert word in out, f"{case}: message does not name {word!r}:\n{out}"


BELOW_MINIMA = [
    ("udp", "30s"),               # RFC 4787 REQ-5: >= 2 min
    ("tcp_established", "1h"),    # RFC 5382 REQ-5: >= 2 h 4 min
    ("tcp_transitory", "1m"),     # RFC 5382 REQ-5: >= 4 min
    ("icmp", "10s"),              # RFC 5508 REQ-2: >= 60 s
]


@pytest.mark.parametrize("key,value", BELOW_MINIMA, ids=[k for k, _ in BELOW_MINIMA])
def test_timeout_below_rfc_minimum_warned_or_refused(natrix, tmp_path, key, value):
    """A timeout below its RFC minimum is either refused (non-zero exit) or
    accepted with a warning; in both cases the output names the key."""
    p = natrix("check-config", _write(tmp_path, MINIMAL + f'[timeouts]\n{key} = "{value}"\n'))
    out = h.proc_text(p)
    assert key in out, f"{key} = {value} (below the RFC minimum) passed without a word:\n{out}"


def test_missing_config_file(natrix, tmp_path):
    p = natrix("check-config", tmp_path / "does-not-exist.toml")
    assert p.returncode != 0, h.proc_text(p)


def test_replay_refuses_bad_config(replay_files):
    """`natrix replay` with an invalid config exits non-zero naming the key."""
    proc, _ = replay_files(MINIMAL + "bogus_key = 1\n", [(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53))])
    assert proc.returncode != 0
    assert "bogus_key" in h.proc_text(proc), h.proc_text(proc)


def test_replay_refuses_unreadable_capture(natrix, tmp_path):
    """Contract: non-zero exit with a message for an unreadable capture (not a
    pcap/pcapng file; missing file)."""
    cfg = _write(tmp_path, MINIMAL)
    junk = tmp_path / "junk.pcapng"
    junk.write_bytes(b"this is not a capture file at all" * 10)
    for src in (junk, tmp_path / "missing.pcapng"):
        p = natrix("replay", "--config", cfg, "--in", src, "--out", tmp_path / "o.pcapng", "--quiet")
        assert p.returncode != 0, f"{src.name}: accepted\n{h.proc_text(p)}"
        assert h.proc_text(p).strip(), f"{src.name}: no message"


def test_replay_with_minimal_config(replay):
    """A replay with the minimal config translates (sanity of the defaults)."""
    outs, _ = replay(MINIMAL, [(T0, "inside", udp_out(SUB_A, 40000, SRV1, 53, b"min"))])
    p = one(outs, "outside", has_payload(b"min")).pkt
    assert p[h.IP].src == POOL1 and p[h.UDP].sport == 40000
