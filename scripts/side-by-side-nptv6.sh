#!/usr/bin/env bash
# NPTv6 (RFC 6296) in natrix side by side with Linux's own, in the same
# namespace lab with the same traffic: 64-byte IPv6/UDP frames from trafgen,
# full blast and the highest offered rate with loss under 0.1%. Linux twice:
# ip6tables' stateless SNPT/DNPT targets, and nftables' `snat/dnat ip6
# prefix to` (through conntrack). Prints a markdown table. Root only.
# The method is in tools/side_by_side/nptv6.py.
#
#   scripts/side-by-side-nptv6.sh [--trial-seconds N] [--steps N] [--flows N] [--out FILE]
#
# NATRIX_BIN: the natrix binary (default target/release/natrix, built if absent).
# Takes about 2 minutes; a run always ends with `natrix lab down`.
set -euo pipefail

TRIAL_SECONDS=3
STEPS=6
FLOWS=1000
OUT=""

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "side-by-side-nptv6: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --trial-seconds) TRIAL_SECONDS="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --flows) FLOWS="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "side-by-side-nptv6: unknown argument $1" >&2; usage 2 ;;
    esac
done
[ -n "$OUT" ] && OUT="$(realpath -m "$OUT")"
[ -n "${NATRIX_BIN:-}" ] && NATRIX_BIN="$(realpath -m "$NATRIX_BIN")"
cd "$(dirname "$0")/.."

[ "$(id -u)" -eq 0 ] || die "must run as root (it builds network namespaces)"
for tool in ip tc nft ip6tables trafgen python3 timeout; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install -y iproute2 nftables iptables netsniff-ng)"
done
if [ -z "${NATRIX_BIN:-}" ]; then
    NATRIX_BIN="$PWD/target/release/natrix"
    [ -x "$NATRIX_BIN" ] || cargo build --release -p natrix
fi

WORK="$(mktemp -d /tmp/side-by-side-nptv6.XXXXXX)"
cleanup() {
    trap - EXIT INT TERM
    "$NATRIX_BIN" lab down >/dev/null 2>&1 || echo "side-by-side-nptv6: \`natrix lab down\` failed" >&2
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for nat in natrix kernel-npt kernel-nft; do
    echo "== $nat" >&2
    up=(lab up --mode off --config-out "$WORK/natrix.toml")
    extra=()
    if [ "$nat" = natrix ]; then
        extra=(--natrix-bin "$NATRIX_BIN" --config "$WORK/natrix.toml")
    else
        up+=(--kernel)
    fi
    "$NATRIX_BIN" lab down >/dev/null
    "$NATRIX_BIN" "${up[@]}" >/dev/null
    python3 tools/side_by_side/nptv6.py --nat "$nat" "${extra[@]}" --workdir "$WORK" \
        --trial-seconds "$TRIAL_SECONDS" --steps "$STEPS" --flows "$FLOWS" --out "$WORK/$nat.json"
    "$NATRIX_BIN" lab down >/dev/null
done

python3 - "$WORK" "$OUT" <<'PY'
import json, sys
work, out = sys.argv[1], sys.argv[2]
rows = ["| NAT | full blast: offered kpps | full blast: delivered kpps | loss < 0.1%: kpps |", "|---|---|---|---|"]
for nat in ("natrix", "kernel-npt", "kernel-nft"):
    r = json.load(open(f"{work}/{nat}.json"))
    if "error" in r:
        rows.append(f"| {nat} | error: {r['error']} | | |")
        continue
    e = r["established"]
    best = e["no_loss"]["offered_pps"] / 1e3 if e["no_loss"] else float("nan")
    rows.append(f"| {nat} | {e['full_blast']['offered_pps'] / 1e3:.1f} | {e['full_blast']['delivered_pps'] / 1e3:.1f} | {best:.1f} |")
table = "\n".join(rows)
print(table)
if out:
    open(out, "w").write(table + "\n")
PY
