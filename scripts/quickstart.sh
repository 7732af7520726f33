#!/usr/bin/env bash
# Builds natrix (release) and replays the shipped example capture through it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p natrix
mkdir -p out
./target/release/natrix check-config examples/natrix.toml
./target/release/natrix replay --config examples/natrix.toml \
    --in examples/subscribers.pcapng --out out/translated.pcapng --report out/report.json
echo "translated frames: out/translated.pcapng   report: out/report.json"
