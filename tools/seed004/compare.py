#!/usr/bin/env python3
"""natrix bench against seed 004's design (tools/seed004/seed004.c), run on
the same host in alternation, so that both meet the same load.

For each size, RUNS rounds of: `natrix bench --flows N --workers 1 --json`,
then `seed004 --flows N`. Prints a markdown table: for each size and pass
the median ns per packet of each, the ratio of the medians, and the median
and range of the per-round ratios (seed004 / natrix: how many times faster
natrix is). Exits 1 if any run of either failed its round-trip check.

    compare.py --natrix BIN --seed004 BIN [--flows N ...] [--runs R] [--json FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

DEFAULT_FLOWS = [1 << 20, 1 << 24, 65_536_000]


def run_json_lines(cmd):
    """Runs cmd; returns its JSON lines keyed by pass."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"compare: {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {line["pass"]: line for line in lines}


def rounds(natrix, seed004, flows, runs, log):
    """RUNS alternating rounds at one size: [(natrix_by_pass, seed_by_pass)]."""
    out = []
    for r in range(runs):
        nat = run_json_lines([natrix, "bench", "--flows", str(flows), "--workers", "1", "--json"])
        seed = run_json_lines([seed004, "--flows", str(flows)])
        for side, lines in (("natrix", nat), ("seed004", seed)):
            for line in lines.values():
                log.append({"round": r, "impl": side, **line})
        print(
            f"  {flows} flows, round {r + 1}/{runs}: "
            + ", ".join(f"{p} {nat[p]['ns_per_packet']:.1f} vs {seed[p]['ns_per_packet']:.1f} ns" for p in ("new", "established")),
            file=sys.stderr,
        )
        out.append((nat, seed))
    return out


def table(results):
    rows = [
        "| flows | pass | natrix ns/packet (median) | seed 004 design ns/packet (median) | ratio of medians | per-round ratio: median (range) |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for flows, rnds in results:
        for p in ("new", "established"):
            nat = [n[p]["ns_per_packet"] for n, _ in rnds]
            seed = [s[p]["ns_per_packet"] for _, s in rnds]
            ratios = [s / n for n, s in zip(nat, seed)]
            rows.append(
                f"| {flows:,} | {p} | {statistics.median(nat):.1f} | {statistics.median(seed):.1f} | "
                f"{statistics.median(seed) / statistics.median(nat):.2f}x | "
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
            )
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--natrix", required=True)
    ap.add_argument("--seed004", required=True)
    ap.add_argument("--flows", type=int, nargs="+", default=DEFAULT_FLOWS)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="also write every run's JSON line here")
    args = ap.parse_args()
    if args.runs < 1 or any(f < 1 for f in args.flows):
        sys.exit("compare: --runs and --flows must be positive")
    log = []
    results = [(f, rounds(args.natrix, args.seed004, f, args.runs, log)) for f in args.flows]
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in log)
    print(table(results))
    if any(line.get("errors", 0) for line in log):
        sys.exit("compare: some packets did not round-trip")


if __name__ == "__main__":
    main()
