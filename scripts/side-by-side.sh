#!/usr/bin/env bash
# natrix side by side with the Linux kernel's nftables NAT in the namespace
# lab, with the same traffic and the same tester: a thin wrapper over
# `natrix test --dut natrix,kernel` (README, "Measuring"). Root only.
#
#   scripts/side-by-side.sh [natrix test arguments...]
#
# e.g. --quick, --out DIR (default out/natrix-test), --tests LIST, --sizes LIST.
# The table is printed and written to DIR/side-by-side.md, the raw results
# to DIR/results.jsonl, the plots beside them.
# NATRIX_BIN: the natrix binary (default target/release/natrix, built if absent).
set -euo pipefail

[ "$(id -u)" -eq 0 ] || { echo "side-by-side: must run as root (it builds network namespaces)" >&2; exit 1; }
if [ -z "${NATRIX_BIN:-}" ]; then
    repo="$(cd "$(dirname "$0")/.." && pwd)"
    NATRIX_BIN="$repo/target/release/natrix"
    [ -x "$NATRIX_BIN" ] || (cd "$repo" && cargo build --release -p natrix)
fi
exec "$NATRIX_BIN" test --dut natrix,kernel "$@"
