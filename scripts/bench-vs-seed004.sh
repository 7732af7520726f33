#!/usr/bin/env bash
# natrix's engine against seed 004's final design, rebuilt in
# tools/seed004/seed004.c, on this host and in alternation, so that a
# shared or changing machine cannot bias the ratio. Prints a markdown table
# of medians and ratios (see docs/BENCHMARKS.md).
#
#   scripts/bench-vs-seed004.sh [--flows N ...] [--runs R] [--json FILE]
#
# Defaults: 1M, 16M and 65.5M flows, 5 rounds each (about 20 minutes; the
# 65.5M seed design alone needs 6.2 GB and two minutes a round).
# NATRIX_BIN: the natrix binary (default target/release/natrix, built if absent).
set -euo pipefail
cd "$(dirname "$0")/.."
NATRIX_BIN="${NATRIX_BIN:-target/release/natrix}"
if [ ! -x "$NATRIX_BIN" ]; then
    cargo build --release -p natrix
fi
mkdir -p target
cc -O3 -march=native -Wall -Wextra -Werror -o target/seed004 tools/seed004/seed004.c
exec python3 tools/seed004/compare.py --natrix "$NATRIX_BIN" --seed004 target/seed004 "$@"
