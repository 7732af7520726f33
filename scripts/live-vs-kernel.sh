#!/usr/bin/env bash
# issue 24's side by side: natrix (one and two workers) against the kernel's
# nftables NAT in the namespace lab, with `natrix test`, alternating the
# devices so a shared host's load falls on all of them alike. Optionally a
# second natrix build (BEFORE=path) for a before/after table.
#   sudo scripts/live-vs-kernel.sh [OUT_DIR]
#   NATRIX=target/release/natrix BEFORE=/path/to/old/natrix ROUNDS=1 TESTS=tcp,throughput,connection_rate,cpu
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-out/live-vs-kernel}"
NATRIX="${NATRIX:-target/release/natrix}"
ROUNDS="${ROUNDS:-1}"
TESTS="${TESTS:-tcp,throughput,connection_rate,cpu}"
COMMON=(--tests "$TESTS" --sizes 64 --max-rate "${MAX_RATE:-300000}" --json)
mkdir -p "$OUT"
run() { # label, then natrix test arguments
    local label="$1"; shift
    echo "== $label" >&2
    # The lab is shared: hold its lock for one run at a time.
    flock /tmp/natrix-lab.lock "$NATRIX" test "$@" "${COMMON[@]}" --out "$OUT/$label" | sed "s/^{/{\"run\":\"$label\",/" >> "$OUT/results.jsonl"
}
for round in $(seq "$ROUNDS"); do
    run "kernel-$round" --dut kernel
    for workers in 1 2; do
        run "natrix-w$workers-$round" --dut natrix --workers "$workers"
        if [ -n "${BEFORE:-}" ]; then
            run "before-w$workers-$round" --dut natrix --workers "$workers" --natrix "$BEFORE"
        fi
    done
done
echo "results: $OUT/results.jsonl" >&2
