#!/usr/bin/env python3
"""Renders the JSON of two measure.py runs (natrix and the kernel) as one
markdown table of natrix/kernel ratios, for scripts/side-by-side.sh.

Usage: report.py NATRIX.json KERNEL.json [--out FILE]
"""

import argparse
import json
import os
import platform
import sys
import time

LOSS_OK_PERCENT = 0.1


def tcp_cell(r):
    t = r.get("tcp")
    if not t:
        return None, "not measured"
    if "error" in t:
        return None, f"failed: {t['error']}"
    return t["gbps"], f"{t['gbps']:.2f} Gbit/s ({t['retransmits']} retransmits)"


def no_loss_cell(r, test):
    t = r.get(test)
    if not t:
        return None, "not measured"
    best = t["no_loss"]
    if best is None:
        return 0.0, f"none (loss >= {LOSS_OK_PERCENT}% at every rate tried)"
    # At full blast already under the threshold: the generator, not the NAT, set the limit.
    bound = ">= " if best["shaped_pps"] is None else ""
    return best["offered_pps"], f"{bound}{best['offered_pps'] / 1e3:.1f} kpps"


def full_blast_cell(r, test):
    t = r.get(test)
    if not t:
        return None, "not measured"
    f = t["full_blast"]
    return f["delivered_pps"], (f"{f['delivered_pps'] / 1e3:.1f} kpps of {f['offered_pps'] / 1e3:.1f} "
                                f"({100 * f['loss']:.2f}% loss)")


def ratio(n, k):
    if n is None or k is None or k == 0:
        return "n/a"
    return f"{n / k:.2f}"


def settings(natrix, kernel):
    """The run's settings, from whichever side was measured."""
    return kernel if "flows" in kernel else natrix


def table(natrix, kernel):
    run = settings(natrix, kernel)
    flows = run.get("flows")
    rows = [
        (f"TCP throughput, iperf3 sub1 -> srv1 ({run.get('tcp_seconds')} s)", tcp_cell),
        (f"64 B UDP, {flows} established flows: highest rate, loss < {LOSS_OK_PERCENT}%",
         lambda r: no_loss_cell(r, "established")),
        (f"64 B UDP, {flows} established flows: full blast, delivered of offered",
         lambda r: full_blast_cell(r, "established")),
        (f"New flows (RFC 4814 random ports): highest rate, loss < {LOSS_OK_PERCENT}%",
         lambda r: no_loss_cell(r, "new_flows")),
        ("New flows: full blast, delivered of offered", lambda r: full_blast_cell(r, "new_flows")),
    ]
    lines = ["| metric | natrix | kernel | natrix/kernel |", "|---|---:|---:|---:|"]
    for name, cell in rows:
        (nv, ns), (kv, ks) = cell(natrix), cell(kernel)
        lines.append(f"| {name} | {ns} | {ks} | {ratio(nv, kv)} |")
    return lines


def notes(natrix, kernel):
    out = [
        f"{time.strftime('%Y-%m-%d %H:%M')}, Linux {platform.release()}, {os.cpu_count()} CPUs; "
        f"UDP trials of {settings(natrix, kernel).get('trial_seconds')} s; offered = frames that left nx-sub1, "
        "delivered = frames that reached nx-srv1. \">=\": no loss even at full blast, so the generator set the limit.",
    ]
    for r in (natrix, kernel):
        if "error" in r:
            out.append(f"{r['mode']}: {r['error']}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("natrix")
    p.add_argument("kernel")
    p.add_argument("--out")
    args = p.parse_args()
    with open(args.natrix) as f:
        natrix = json.load(f)
    with open(args.kernel) as f:
        kernel = json.load(f)
    text = "\n".join(table(natrix, kernel) + [""] + notes(natrix, kernel)) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
