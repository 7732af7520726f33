#!/usr/bin/env bash
# natrix side by side with the Linux kernel (nftables masquerade), in the
# same namespace lab (`natrix lab up`, then `natrix lab up --kernel`), with
# the same traffic: iperf3 TCP, 64-byte UDP over established flows, and new
# flows. Prints one markdown table of natrix/kernel ratios. Root only.
# The method is in tools/side_by_side/measure.py.
#
#   scripts/side-by-side.sh [--tcp-seconds N] [--trial-seconds N] [--steps N]
#                           [--flows N] [--workers N] [--io MODE]
#                           [--only natrix|kernel] [--out FILE]
#
# --workers and --io go into natrix's configuration (`natrix lab up`).
# NATRIX_BIN: the natrix binary (default target/release/natrix, built if absent).
# The defaults take 2 to 3 minutes; a run always ends with `natrix lab down`.
set -euo pipefail

TCP_SECONDS=10
TRIAL_SECONDS=3
STEPS=6
FLOWS=1000
WORKERS=1
IO=auto
ONLY=""
OUT=""

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "side-by-side: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --tcp-seconds) TCP_SECONDS="$2"; shift 2 ;;
        --trial-seconds) TRIAL_SECONDS="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --flows) FLOWS="$2"; shift 2 ;;
        --workers) WORKERS="$2"; shift 2 ;;
        --io) IO="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "side-by-side: unknown argument $1" >&2; usage 2 ;;
    esac
done
case "$ONLY" in ""|natrix|kernel) ;; *) die "--only takes natrix or kernel" ;; esac
# Paths given by the caller are relative to where they ran this from.
[ -n "$OUT" ] && OUT="$(realpath -m "$OUT")"
[ -n "${NATRIX_BIN:-}" ] && NATRIX_BIN="$(realpath -m "$NATRIX_BIN")"
cd "$(dirname "$0")/.."

check_prerequisites() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (it builds network namespaces)"
    # The one package CI installs for this script; everything else is expected.
    command -v nft >/dev/null || die "nft is missing: apt-get install -y nftables"
    local tool
    for tool in ip tc ss ethtool trafgen iperf3 python3 timeout; do
        command -v "$tool" >/dev/null || die "$tool is missing"
    done
}

find_natrix() {
    if [ -n "${NATRIX_BIN:-}" ]; then
        [ -x "$NATRIX_BIN" ] || die "NATRIX_BIN=$NATRIX_BIN is not an executable"
    else
        NATRIX_BIN="$PWD/target/release/natrix"
        [ -x "$NATRIX_BIN" ] || cargo build --release -p natrix
    fi
    "$NATRIX_BIN" lab --help >/dev/null 2>&1 || die "$NATRIX_BIN has no \`lab\` command: rebuild it"
}

# Both sides share this host's CPUs with the generator: other work skews
# the figures more than any difference between the two NATs.
warn_if_busy() {
    local load cpus
    load="$(cut -d' ' -f1 /proc/loadavg)"
    cpus="$(nproc)"
    if awk -v l="$load" -v c="$cpus" 'BEGIN { exit !(l > c / 4) }'; then
        echo "side-by-side: warning: load average $load on $cpus CPUs; figures from a busy host are noisy" >&2
    fi
}

WORK=""
MEASURE_PID=""
cleanup() {
    trap - EXIT INT TERM
    if [ -n "$MEASURE_PID" ]; then
        kill "$MEASURE_PID" 2>/dev/null || true
        wait "$MEASURE_PID" 2>/dev/null || true
    fi
    # measure.py stops natrix itself; after an interrupt, `lab down` ends
    # whatever still runs in the lab (natrix, trafgen, iperf3).
    "$NATRIX_BIN" lab down >/dev/null 2>&1 || echo "side-by-side: \`natrix lab down\` failed" >&2
    [ -n "$WORK" ] && rm -rf "$WORK"
}

# measure MODE: builds the lab for MODE, measures it into $WORK/MODE.json, removes the lab.
measure() {
    local mode="$1" up=(lab up --config-out "$WORK/natrix.toml" --workers "$WORKERS" --io "$IO") extra=()
    if [ "$mode" = kernel ]; then
        up+=(--kernel)
    else
        extra=(--natrix-bin "$NATRIX_BIN" --config "$WORK/natrix.toml")
    fi
    if [ -n "$ONLY" ] && [ "$ONLY" != "$mode" ]; then
        printf '{"mode": "%s", "skipped": true}\n' "$mode" >"$WORK/$mode.json"
        return
    fi
    echo "== $mode" >&2
    "$NATRIX_BIN" lab down >/dev/null
    "$NATRIX_BIN" "${up[@]}" >/dev/null
    # In the background, so that a signal to this script runs its trap at once.
    python3 tools/side_by_side/measure.py --mode "$mode" "${extra[@]}" --workdir "$WORK" \
        --tcp-seconds "$TCP_SECONDS" --trial-seconds "$TRIAL_SECONDS" --steps "$STEPS" --flows "$FLOWS" \
        --out "$WORK/$mode.json" &
    MEASURE_PID=$!
    wait "$MEASURE_PID"
    MEASURE_PID=""
    "$NATRIX_BIN" lab down >/dev/null
}

check_prerequisites
find_natrix
warn_if_busy
WORK="$(mktemp -d /tmp/side-by-side.XXXXXX)"
trap cleanup EXIT
trap 'exit 130' INT TERM

measure natrix
measure kernel
echo >&2
python3 tools/side_by_side/report.py "$WORK/natrix.json" "$WORK/kernel.json" ${OUT:+--out "$OUT"}
# Non-zero when a side could not be measured (natrix never ready, or it died).
python3 -c 'import json, sys; sys.exit(any("error" in json.load(open(p)) for p in sys.argv[1:]))' \
    "$WORK/natrix.json" "$WORK/kernel.json"
