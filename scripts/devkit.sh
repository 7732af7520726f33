#!/bin/bash
# Packs what `natrix test` needs into .devkit/ (git-ignored), for a machine
# that has the kernel but not the tools: a lent measurement machine runs
# `.devkit/run.sh` from a copy of the working tree that carries .devkit.
#
#   scripts/devkit.sh            # on a Debian machine with the tools, as root
#
# .devkit/root/bin holds wrappers for ip, ss, nft, iperf3, ethtool, sysctl
# and tc that run this machine's binaries (.devkit/root/real) with their
# libraries (.devkit/root/lib, all but the C library's own, which the
# other machine has); .devkit/natrix is a stripped release build;
# .devkit/CONFIG.toml are natrix configurations for the lab: the lab's own
# with the tester's limits lifted (as `natrix test` writes it), for 1, 2
# and 4 workers (wN.toml), with `offload` off (wN-nooffload.toml) or
# without deferral (`prefer_busy_poll = false`, wN-nodefer.toml), or with
# generic XDP programs (`xdp_mode = "generic"`, wN-generic.toml). With
# DEVKIT_PERF=1 the kit holds perf too. On the other machine:
#
#   RUNS="kernel:1:1 natrix:1:1:w1.toml natrix:1:1:w1-nooffload.toml" BUDGET=400 OUT=$OUT .devkit/run.sh
#
# each run DUT:WORKERS:QUEUES[:CONFIG[:OPTIONS]] one `natrix test --json`
# (TESTS, MAXRATE and NTARGS, options for every run, as below; OPTIONS,
# comma-separated, for that run alone, e.g.
# natrix:1:1:w1.toml:--switch-napi=lab; with --natrix=.devkit/FILE it
# measures another build put there), results in
# $OUT/results.jsonl with the run and NTARGS named, stderr and natrix's
# logs in $OUT/logs.tgz; runs past BUDGET seconds are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.devkit
TOOLS=(ip ss nft iperf3 ethtool sysctl tc)
# perf (28 MiB with its libraries) where asked for: DEVKIT_PERF=1.
if [ "${DEVKIT_PERF:-0}" = 1 ]; then TOOLS+=(perf); fi
# The C library's own: the other machine's are used.
SYSTEM_LIBS='/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so'

rm -rf "$KIT"
mkdir -p "$KIT/root/bin" "$KIT/root/real" "$KIT/root/lib"
for tool in "${TOOLS[@]}"; do
    path=$(command -v "$tool") || { echo "devkit: $tool is missing (apt-get install iproute2 nftables iperf3 ethtool procps)" >&2; exit 1; }
    cp -L "$path" "$KIT/root/real/$tool"
    for lib in $(ldd "$path" | awk '/=> \// {print $3}'); do
        [[ $lib =~ $SYSTEM_LIBS ]] || cp -Ln "$lib" "$KIT/root/lib/"
    done
    cat > "$KIT/root/bin/$tool" <<EOF
#!/bin/sh
d=\$(dirname "\$(readlink -f "\$0")")/..
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/real/$tool" "\$@"
EOF
    chmod +x "$KIT/root/bin/$tool"
done

cargo build --release --quiet
strip -o "$KIT/natrix" target/release/natrix

# The lab's configuration, written by the lab itself, with the limits
# `natrix test` lifts (ports and sessions per subscriber, the table sized
# as the kernel's conntrack default).
lab=$(mktemp)
trap 'rm -f "$lab"' EXIT
"$KIT/natrix" lab up --config-out "$lab" >/dev/null
"$KIT/natrix" lab down >/dev/null
python3 - "$lab" "$KIT" <<'EOF'
import sys
lab, kit = sys.argv[1], sys.argv[2]
base = open(lab).read()
base = base.replace("max_ports_per_subscriber = 2000\n", "max_ports_per_subscriber = 64512\nmax_sessions_per_subscriber = 1048576\nmax_sessions = 262144\n")
assert "max_sessions = 262144" in base, "the lab's configuration changed: update scripts/devkit.sh"
for workers in (1, 2, 4):
    for name, extra in (("", ""), ("-nooffload", "offload = false\n"), ("-nodefer", "prefer_busy_poll = false\n"), ("-generic", "xdp_mode = \"generic\"\n")):
        text = base.replace("workers = 1\n", f"workers = {workers}\n{extra}")
        open(f"{kit}/w{workers}{name}.toml", "w").write(text)
EOF

cat > "$KIT/run.sh" <<'EOF'
#!/bin/bash
# RUNS="DUT:WORKERS:QUEUES[:CONFIG[:OPTIONS]] ..." BUDGET=seconds OUT=dir (scripts/devkit.sh).
cd "$(dirname "$0")/.."
K=$PWD/.devkit
export PATH=$K/root/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nproc; uname -r; } > "$OUT/machine"
start=$(date +%s)
n=0
for r in $RUNS; do
  n=$((n + 1))
  IFS=: read -r dut w q config options <<< "$r"
  if [ $(( $(date +%s) - start )) -gt "${BUDGET:-400}" ]; then echo "budget: skip $r" >> "$OUT/log"; continue; fi
  args=(--dut "$dut" --workers "$w" --queues "$q" --tests "${TESTS:-tcp,throughput,connection_rate,cpu}" --sizes 64
        --max-rate "${MAXRATE:-1500000}" --trial-seconds 1 --json --out /tmp/nt)
  [[ "$options ${NTARGS:-}" == *--natrix* ]] || args+=(--natrix "$K/natrix")
  [ -n "$config" ] && args+=(--config "$K/$config")
  # More `natrix test` options for every run, e.g. NTARGS="--switch-napi lab".
  [ -n "${NTARGS:-}" ] && read -r -a more <<< "$NTARGS" && args+=("${more[@]}")
  [ -n "$options" ] && IFS=, read -r -a more <<< "$options" && args+=("${more[@]}")
  echo "== $r ${NTARGS:-} $(date +%T)" >> "$OUT/log"
  timeout 150 "$K/natrix" test "${args[@]}" 2> "$OUT/stderr-$n-$dut-$w-$q" | sed "s|^{|{\"run\":\"$r\",\"ntargs\":\"${NTARGS:-}\",|" >> "$OUT/results.jsonl"
  echo "rc ${PIPESTATUS[0]} $(date +%T)" >> "$OUT/log"
  cp /tmp/nt/natrix.log "$OUT/natrix-$n-$dut-$w-$q-${config%.toml}.log" 2>/dev/null
  "$K/natrix" lab down > /dev/null 2>&1
done
# Few files come back from a lent machine: the logs as one archive.
(cd "$OUT" && shopt -s nullglob && logs=(stderr-* natrix-*.log) && [ ${#logs[@]} -gt 0 ] && tar czf logs.tgz "${logs[@]}" && rm -f "${logs[@]}") || true
EOF
chmod +x "$KIT/run.sh"
echo "devkit: $KIT ready ($(du -sh "$KIT" | cut -f1)); carry it to the other machine with the working tree"
