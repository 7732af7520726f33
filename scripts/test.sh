#!/usr/bin/env bash
# The whole test suite: unit and property tests, clippy, the conformance suite
# (scapy builds and checks the packets, never natrix's own code), and a bounded
# fuzzing run. Installs what it needs on a fresh machine.
#   FUZZ_SECONDS=N  fuzzing time (default 60; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"

step() { printf '\n=== %s\n' "$*"; }

step "python test dependencies"
python3 -c 'import scapy, pytest, prometheus_client' 2>/dev/null || python3 -m pip install --quiet scapy pytest prometheus-client \
    || python3 -m pip install --quiet --break-system-packages scapy pytest prometheus-client

step "formatting (cargo fmt --check)"
cargo fmt --all --check

step "cargo build and unit/property tests"
cargo build --workspace --all-targets
cargo test --workspace

step "clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "conformance suite (pytest + scapy)"
NATRIX_BIN="$PWD/target/debug/natrix" python3 -m pytest tests/conformance -q

step "end-to-end tests through natrix run in the namespace lab"
if [ "$(id -u)" -eq 0 ]; then
    NATRIX_BIN="$PWD/target/debug/natrix" python3 -m pytest tests/e2e -q -rs
    # The same tests in natrix's other arrangements (tests/e2e/README.md);
    # a failure is run once more before it counts, and is reported either way.
    for arrangement in "NATRIX_E2E_WORKERS=2" "NATRIX_E2E_IO=af_packet" "NATRIX_E2E_IO=af_packet NATRIX_E2E_WORKERS=2" "NATRIX_E2E_XDP_MODE=generic"; do
        step "end-to-end tests again with $arrangement"
        e2e=(env $arrangement NATRIX_BIN="$PWD/target/debug/natrix" python3 -m pytest tests/e2e -q -rs
            --ignore=tests/e2e/test_e2e_cluster.py --ignore=tests/e2e/test_e2e_lock.py
            --ignore=tests/e2e/test_e2e_queues.py --ignore=tests/e2e/test_e2e_tester.py)
        "${e2e[@]}" || { echo "FLAKY OR FAILING with $arrangement: running the failures once more"; "${e2e[@]}" --lf; }
    done
else
    echo "SKIPPED: the end-to-end tests build network namespaces and need root; run as root to include them"
fi

step "example replay: every emitted checksum verified by scapy"
mkdir -p out
./target/debug/natrix replay --quiet --config examples/natrix.toml --in examples/subscribers.pcapng \
    --out out/test-example.pcapng --report out/test-example.json
python3 tools/verify_checksums.py out/test-example.pcapng

step "seed 004's design rebuilt (the benchmark baseline): builds, round-trips, compares at a small size"
NATRIX_BIN="$PWD/target/debug/natrix" ./scripts/bench-vs-seed004.sh --flows 4096 --runs 1

step "Debian package: build, dpkg -i, checks, dpkg --purge (root; skipped otherwise)"
./scripts/test-package.sh

if [ "$FUZZ_SECONDS" -gt 0 ]; then
    step "fuzzing Engine::process for ${FUZZ_SECONDS}s"
    rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
    cargo +nightly fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
    python3 tools/fuzz_seeds.py fuzz/corpus/engine_process
    cargo +nightly fuzz run engine_process fuzz/corpus/engine_process -- \
        -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=1024 -print_final_stats=1
    step "fuzzing SCTP NAT (seed 001) for ${FUZZ_SECONDS}s"
    python3 tools/sctp_fuzz_seeds.py fuzz/corpus/sctp_nat
    cargo +nightly fuzz run sctp_nat fuzz/corpus/sctp_nat -- \
        -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=1024 -print_final_stats=1
fi

step "all tests passed"
