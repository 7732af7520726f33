#!/usr/bin/env python3
"""NPTv6 (RFC 6296) side by side with Linux's own, in the namespace lab:
scripts/side-by-side-nptv6.sh runs it once per NAT. The lab that `natrix
lab up --mode off` built (or `--kernel --mode off`) is adapted in place to
RFC 6296 section 3.6's binding fd01:203:405::/48 <-> 2001:db8:1::/48:
nx-sub1 gets fd01:203:405:1::2/64 behind natrix's inside address
fd01:203:405:1::1, and nx-srv1 routes 2001:db8:1::/48 to the NAT.

The NATs:
- natrix: `natrix run` with the lab's configuration, its inside address6 in
  the site-local prefix and one [[nptv6]] binding.
- kernel-npt: Linux's stateless NPTv6, ip6tables' SNPT and DNPT targets in
  the mangle table (RFC 6296 checksum-neutral, as natrix).
- kernel-nft: nftables prefix NAT, `snat ip6 prefix to` / `dnat ip6 prefix
  to` (stateful, through conntrack, not checksum-neutral).

Traffic and method are measure.py's (trafgen from nx-sub1 to nx-srv1's
discard port; full blast, then a search for the highest offered rate with
loss under 0.1%), here with 64-byte IPv6/UDP frames (Ethernet 14, IPv6 40,
UDP 8, 2 bytes of payload) over --flows source ports of the one host; the
frames are counted, then dropped, as they enter nx-srv1.

Usage: nptv6.py --nat natrix|kernel-npt|kernel-nft [--natrix-bin BIN --config FILE] --workdir DIR --out FILE.json
"""

import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

NAT, SUB, SRV = measure.NAT, measure.SUB, measure.SRV
INSIDE_PREFIX, OUTSIDE_PREFIX = "fd01:203:405::/48", "2001:db8:1::/48"
HOST6, NAT_INSIDE6, NAT_OUTSIDE6, SRV6 = "fd01:203:405:1::2", "fd01:203:405:1::1", "2001:db8:2::1", "2001:db8:2::11"
LAB_INSIDE6 = "2001:db8:1::1/64"
COUNTER_TABLE = "natrix_side_by_side6"
FRAME_BYTES = 64

KERNEL_NPT = [
    ["-t", "mangle", "-A", "POSTROUTING", "-o", "outside", "-s", INSIDE_PREFIX, "-j", "SNPT",
     "--src-pfx", INSIDE_PREFIX, "--dst-pfx", OUTSIDE_PREFIX],
    ["-t", "mangle", "-A", "PREROUTING", "-i", "outside", "-d", OUTSIDE_PREFIX, "-j", "DNPT",
     "--src-pfx", OUTSIDE_PREFIX, "--dst-pfx", INSIDE_PREFIX],
]
KERNEL_NFT = (f"add table ip6 natrix_nptv6; "
              f"add chain ip6 natrix_nptv6 post {{ type nat hook postrouting priority srcnat; }}; "
              f"add rule ip6 natrix_nptv6 post oifname \"outside\" ip6 saddr {INSIDE_PREFIX} snat ip6 prefix to {OUTSIDE_PREFIX}; "
              f"add chain ip6 natrix_nptv6 pre {{ type nat hook prerouting priority dstnat; }}; "
              f"add rule ip6 natrix_nptv6 pre iifname \"outside\" ip6 daddr {OUTSIDE_PREFIX} dnat ip6 prefix to {INSIDE_PREFIX}")


def adapt_lab(nat):
    """The hosts' side of the binding, and the NAT's when it is the kernel."""
    measure.netns(SUB, "ip", "-6", "addr", "add", f"{HOST6}/64", "dev", "eth0", "nodad")
    measure.netns(SUB, "ip", "-6", "route", "replace", "default", "via", NAT_INSIDE6, "src", HOST6)
    measure.netns(SRV, "ip", "-6", "route", "add", OUTSIDE_PREFIX, "via", NAT_OUTSIDE6)
    if nat == "natrix":
        return
    measure.netns(NAT, "ip", "-6", "addr", "del", LAB_INSIDE6, "dev", "inside")
    measure.netns(NAT, "ip", "-6", "addr", "add", f"{NAT_INSIDE6}/64", "dev", "inside", "nodad")
    if nat == "kernel-npt":
        for rule in KERNEL_NPT:
            measure.netns(NAT, "ip6tables", *rule)
    else:
        measure.netns(NAT, "nft", KERNEL_NFT)


def natrix_config(lab_config, path):
    """The lab's configuration with the inside address6 in the site-local
    prefix and the binding."""
    with open(lab_config) as f:
        text = f.read()
    text, n = re.subn(r'(?m)^address6 = "2001:db8:1::1/64"$', f'address6 = "{NAT_INSIDE6}/64"', text)
    if n != 1:
        raise RuntimeError(f"{lab_config}: no inside address6 to replace")
    text += f'\n[[nptv6]]\ninside = "{INSIDE_PREFIX}"\noutside = "{OUTSIDE_PREFIX}"\n'
    with open(path, "w") as f:
        f.write(text)


def install_arrival_counter():
    """Counts, then drops, UDP over IPv6 from the external prefix as it
    enters nx-srv1: what crossed the NAT, translated."""
    t = COUNTER_TABLE
    measure.netns(SRV, "nft", f"add table ip6 {t}; "
                             f"add chain ip6 {t} in {{ type filter hook prerouting priority raw; }}; "
                             f"add rule ip6 {t} in iifname \"eth0\" ip6 saddr {OUTSIDE_PREFIX} meta l4proto udp counter drop")


def arrivals():
    listing = json.loads(measure.netns(SRV, "nft", "-j", "list", "table", "ip6", COUNTER_TABLE))
    for item in listing["nftables"]:
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                return expr["counter"]["packets"]
    raise RuntimeError(f"no counter in nx-srv1's table {COUNTER_TABLE}")


def write_trafgen_config(workdir, flows):
    eth = f"eth(da={measure.mac(NAT, 'inside')}, sa={measure.mac(SUB, 'eth0')})"
    text = (f"{{ {eth}, ipv6(sa={HOST6}, da={SRV6}, hl=64), "
            f"udp(sp=dinc(10000, {10000 + flows - 1}), dp=9), fill(0, 2) }}\n")
    path = os.path.join(workdir, "nptv6.trafgen")
    with open(path, "w") as f:
        f.write(text)
    return path


def measure_nat(args, nat):
    result = {"nat": args.nat, "mode": args.nat, "flows": args.flows, "frame_bytes": FRAME_BYTES,
              "trial_seconds": args.trial_seconds, "cpus": os.cpu_count()}
    try:
        adapt_lab(args.nat)
        nat.start()
        measure.steer_receive_off_cpu0()
        install_arrival_counter()
        cfg = write_trafgen_config(args.workdir, args.flows)
        measure.warm_up(args.workdir, cfg, args.flows)
        result["established"] = measure.rate_test("nptv6", cfg, args, nat, fresh=False)
    except (measure.NatFailed, RuntimeError, subprocess.SubprocessError) as e:
        result["error"] = str(e)
        measure.log(f"  {args.nat}: {e}")
    finally:
        nat.stop()
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nat", choices=["natrix", "kernel-npt", "kernel-nft"], required=True)
    p.add_argument("--natrix-bin")
    p.add_argument("--config", help="the lab's natrix configuration (natrix)")
    p.add_argument("--trial-seconds", type=float, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--flows", type=int, default=1000)
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    # measure.py's trials, with IPv6's frame size and arrival counter.
    measure.FRAME_BYTES = FRAME_BYTES
    measure.arrivals = arrivals
    args.mode = args.nat
    if args.nat == "natrix":
        if not (args.natrix_bin and args.config):
            p.error("natrix needs --natrix-bin and --config")
        config = os.path.join(args.workdir, "natrix-nptv6.toml")
        natrix_config(args.config, config)
        nat = measure.Natrix(args.natrix_bin, config, os.path.join(args.workdir, "natrix.log"))
    else:
        nat = measure.Kernel()
    result = measure_nat(args, nat)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
