#!/usr/bin/env python3
"""Plots `natrix bench --json` output as an SVG: Mpps against flows (log
scale), one line per pass, worker count and order (`--order`; lines without
the field are creation order). No plotting library needed.

usage: natrix bench --json > bench.jsonl; tools/plot_bench.py bench.jsonl docs/bench.svg
"""

import json
import math
import sys

W, H, L, R, T, B = 860, 420, 70, 300, 30, 60
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    series = {}
    for r in rows:
        series.setdefault((r["pass"], r["workers"], r.get("order", "created")), []).append((r["flows"], r["mpps"]))
    xs = [f for pts in series.values() for f, _ in pts]
    ymax = max(m for pts in series.values() for _, m in pts) * 1.15
    lx0, lx1 = math.log10(min(xs)), math.log10(max(xs))
    px = lambda f: L + (math.log10(f) - lx0) / max(lx1 - lx0, 1e-9) * (W - L - R)
    py = lambda m: H - B - m / ymax * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>',
           f'<text x="{(L+W-R)/2}" y="{H-15}" text-anchor="middle">flows (log scale)</text>',
           f'<text x="15" y="{(T+H-B)/2}" transform="rotate(-90 15 {(T+H-B)/2})" text-anchor="middle">Mpps</text>']
    for f in sorted(set(xs)):
        out.append(f'<text x="{px(f):.1f}" y="{H-B+16}" text-anchor="middle">{label(f)}</text>')
    for i in range(6):
        m = ymax * i / 5
        out.append(f'<text x="{L-6}" y="{py(m)+4:.1f}" text-anchor="end">{m:.1f}</text>')
        out.append(f'<line x1="{L}" y1="{py(m):.1f}" x2="{W-R}" y2="{py(m):.1f}" stroke="#ddd"/>')
    for i, ((pas, workers, order), pts) in enumerate(sorted(series.items())):
        c = COLORS[i % len(COLORS)]
        dash = "" if order == "created" else ' stroke-dasharray="6,3"'
        pts.sort()
        path = " ".join(f"{px(f):.1f},{py(m):.1f}" for f, m in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        out += [f'<circle cx="{px(f):.1f}" cy="{py(m):.1f}" r="3" fill="{c}"/>' for f, m in pts]
        y = T + 20 * i
        out.append(f'<line x1="{W-R+15}" y1="{y}" x2="{W-R+35}" y2="{y}" stroke="{c}" stroke-width="2"{dash}/>')
        name = f'{pas}, {workers} worker{"s" if workers > 1 else ""}' + ("" if order == "created" else ", random order")
        out.append(f'<text x="{W-R+40}" y="{y+4}">{name}</text>')
    out.append("</svg>")
    open(sys.argv[2], "w").write("\n".join(out) + "\n")


def label(f):
    for div, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if f >= div:
            return f"{f / div:g}{suffix}"
    return str(f)


if __name__ == "__main__":
    main()
