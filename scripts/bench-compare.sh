#!/usr/bin/env bash
# Two builds of natrix's engine, measured in alternation on this host in one
# run, so that a shared or changing machine meets both alike: builds OLD and
# NEW each in a clean copy of its own, then runs their `natrix bench` in turn
# (OLD, NEW; then NEW, OLD; ...) and prints a markdown table of the new and
# established passes, with how it was made, for docs/BENCHMARKS.md.
#
#   scripts/bench-compare.sh OLD NEW [--flows N] [--runs K] [--orders "created random"]
#                            [--workers W] [--tolerance PCT] [--json FILE] [--rebuild]
#
# OLD, NEW   commits (anything `git rev-parse` takes: a sha, HEAD~1, a tag);
#            either may be WORKTREE: the working tree as it is, uncommitted
#            changes and untracked files git does not ignore included.
# --flows    flows per run (default 1048576: 1 M)
# --runs     rounds (default 7); each round runs both builds once per order
# --orders   bench orders, space separated (default "created random")
# --workers  bench workers (default 1: the per-core figures the targets use)
# --tolerance  percent within which NEW counts as "within" OLD (default 3)
# --json     also write every run's JSON line, tagged, to FILE
# --rebuild  build again even if a commit's binary is already cached
#
# Builds: each commit is exported with `git archive` (nothing in this
# repository's working tree, index or refs changes) into
# ${BENCH_COMPARE_DIR:-/tmp/natrix-bench-compare}/<sha>/src and built with
# `cargo build --release -p natrix` and CARGO_TARGET_DIR=<that dir>/target;
# its binary is kept there, so a later run of the same commit does not
# build again. WORKTREE is copied (changed files only, so cargo rebuilds only
# what changed) into worktree-<id>/ beside them and built every time.
# A release build from scratch takes 1-5 minutes on two cores; each
# commit's directory then holds about 250 MB (remove it to reclaim them).
#
# Each cell is the median (min-max) of K runs of ns per packet; NEW/OLD is
# the ratio of the medians (above 1: NEW is slower), and the per-round
# column the median (range) of the K paired ratios. The verdict is a
# measurement, not a test: the script exits 0 whatever it says, and
# non-zero only if a build or a run fails.
#
# Example (issue 17 item 9): scripts/bench-compare.sh <commit before the issue> WORKTREE
# Smoke run:                 scripts/bench-compare.sh HEAD~1 HEAD --flows 65536 --runs 2
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

die() {
    echo "bench-compare: $*" >&2
    exit 1
}

positive_int() {
    [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] || die "$1 needs a positive integer, got '$2'"
}

INVOCATION="scripts/bench-compare.sh"
for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:~^@=+-]+$ ]]; then INVOCATION+=" $a"; else INVOCATION+=" $(printf '%q' "$a")"; fi
done

FLOWS=1048576
RUNS=7
ORDERS="created random"
WORKERS=1
TOLERANCE=3
JSON_OUT=""
REBUILD=0
REFS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --flows) [ $# -ge 2 ] || die "--flows needs a value"; positive_int --flows "$2"; FLOWS=$2; shift 2 ;;
        --runs) [ $# -ge 2 ] || die "--runs needs a value"; positive_int --runs "$2"; RUNS=$2; shift 2 ;;
        --orders) [ $# -ge 2 ] || die "--orders needs a value"; ORDERS=$2; shift 2 ;;
        --workers) [ $# -ge 2 ] || die "--workers needs a value"; positive_int --workers "$2"; WORKERS=$2; shift 2 ;;
        --tolerance)
            [ $# -ge 2 ] || die "--tolerance needs a value"
            [[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--tolerance needs a percentage, got '$2'"
            TOLERANCE=$2; shift 2 ;;
        --json) [ $# -ge 2 ] || die "--json needs a file"; JSON_OUT=$2; shift 2 ;;
        --rebuild) REBUILD=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) REFS+=("$1"); shift ;;
    esac
done
[ ${#REFS[@]} -eq 2 ] || die "give two commits, OLD and NEW (either may be WORKTREE); --help for more"
[ "$FLOWS" -ge "$WORKERS" ] || die "--flows ($FLOWS) must be at least --workers ($WORKERS)"
read -r -a ORDER_LIST <<<"$ORDERS"
[ ${#ORDER_LIST[@]} -ge 1 ] || die "--orders is empty"
for o in "${ORDER_LIST[@]}"; do
    case "$o" in created | random) ;; *) die "unknown order '$o' (created or random)" ;; esac
done
if [ -n "$JSON_OUT" ]; then
    mkdir -p "$(dirname "$JSON_OUT")"
    JSON_OUT=$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")
fi

command -v python3 >/dev/null || die "python3 is needed (statistics and JSON)"
command -v cargo >/dev/null || die "cargo is needed"
ROOT=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel 2>/dev/null) || die "not inside natrix's git repository"
BASE=${BENCH_COMPARE_DIR:-/tmp/natrix-bench-compare}
mkdir -p "$BASE"
BASE=$(cd "$BASE" && pwd)

TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench-compare.XXXXXX")
cleanup() {
    rm -rf "$TMP"
    # A half-made copy (interrupted export) is not left for a later run.
    [ -z "$PARTIAL" ] || rm -rf "$PARTIAL"
}
PARTIAL=""
trap cleanup EXIT
trap 'exit 130' INT TERM

# Statistics and tables; bash only runs things.
cat >"$TMP/stats.py" <<'PY'
import json, statistics, sys

def lines(path):
    with open(path) as fh:
        return [json.loads(l) for l in fh if l.startswith("{")]

def pick(rows, flows, workers, order):
    """The run's new and established lines, {pass: row}; dies if one is missing."""
    out = {}
    for r in rows:
        if r.get("flows") != flows or r.get("workers") != workers:
            continue
        if r.get("order", "created") != order:
            continue
        out[r["pass"]] = r
    missing = [p for p in ("new", "established") if p not in out]
    if missing:
        sys.exit(f"bench-compare: the run printed no {' or '.join(missing)} line for "
                 f"{flows} flows, {workers} workers, order {order}")
    bad = [p for p, r in out.items() if r.get("errors", 0)]
    if bad:
        sys.exit(f"bench-compare: packets failed to round-trip in the {', '.join(bad)} pass")
    return out

def run(args):
    # run FILE FLOWS WORKERS ORDER SIDE ROUND LABEL SHA LOG: checks one run,
    # appends its two lines (tagged) to LOG, prints a one-line summary.
    path, flows, workers, order, side, rnd, label, sha, log = args
    got = pick(lines(path), int(flows), int(workers), order)
    with open(log, "a") as fh:
        for p in ("new", "established"):
            fh.write(json.dumps({"side": side, "build": label, "commit": sha, "round": int(rnd),
                                 **got[p], "order": order}) + "\n")
    print(f"new {got['new']['ns_per_packet']:.1f}, established {got['established']['ns_per_packet']:.1f} ns/packet")

def cell(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"

def table(args):
    # table LOG ORDERS TOLERANCE
    log, orders, tol = args[0], args[1].split(), float(args[2])
    rows = lines(log)
    out = ["| order | pass | OLD ns/packet, median (min-max) | NEW ns/packet, median (min-max) "
           "| NEW/OLD (medians) | per-round NEW/OLD, median (range) | verdict |",
           "|---|---|---:|---:|---:|---|---|"]
    for order in orders:
        for p in ("established", "new"):
            sel = [r for r in rows if r["order"] == order and r["pass"] == p]
            old = {r["round"]: r["ns_per_packet"] for r in sel if r["side"] == "OLD"}
            new = {r["round"]: r["ns_per_packet"] for r in sel if r["side"] == "NEW"}
            rounds = sorted(set(old) & set(new))
            if not rounds:
                continue
            o = [old[k] for k in rounds]
            n = [new[k] for k in rounds]
            ratio = statistics.median(n) / statistics.median(o)
            paired = [new[k] / old[k] for k in rounds]
            pct = (ratio - 1) * 100
            if abs(pct) <= tol:
                verdict = f"within {tol:g}%"
            elif pct > 0:
                verdict = f"slower by {pct:.1f}%"
            else:
                verdict = f"faster by {-pct:.1f}%"
            out.append(f"| {order} | {p} | {cell(o)} | {cell(n)} | {ratio:.3f} | "
                       f"{statistics.median(paired):.3f} ({min(paired):.3f}-{max(paired):.3f}) | {verdict} |")
    print("\n".join(out))

{"run": run, "table": table}[sys.argv[1]](sys.argv[2:])
PY

# resolve REF -> sets R_SHA (or "WORKTREE") and R_LABEL (human-readable).
resolve() {
    local ref=$1
    if [ "$ref" = WORKTREE ]; then
        local head changed untracked
        head=$(git -C "$ROOT" rev-parse --short=12 HEAD)
        changed=$(git -C "$ROOT" status --porcelain --untracked-files=no | wc -l)
        untracked=$(git -C "$ROOT" ls-files -o --exclude-standard | wc -l)
        R_SHA=WORKTREE
        R_LABEL="WORKTREE ($ROOT: HEAD $head + $changed changed tracked and $untracked untracked files)"
    else
        R_SHA=$(git -C "$ROOT" rev-parse --verify --quiet "${ref}^{commit}") ||
            die "'$ref' is not a commit in $ROOT (nor WORKTREE)"
        R_LABEL=$(git -C "$ROOT" log -1 --format='%h (%cs) %<(60,trunc)%s' "$R_SHA" | sed 's/ *$//')
        case "$R_SHA" in "$ref"*) ;; *) R_LABEL="$ref = $R_LABEL" ;; esac
    fi
}

# Copies the working tree's tracked and untracked-but-not-ignored files into
# $1, writing only files whose content changed (so their mtimes move and
# cargo rebuilds just those crates) and removing files no longer there.
sync_worktree() {
    local dest=$1
    mkdir -p "$dest"
    git -C "$ROOT" ls-files -z -co --exclude-standard >"$TMP/files"
    python3 - "$ROOT" "$dest" "$TMP/files" "$BASE" <<'PY'
import os, shutil, sys
root, dest, listing, base = sys.argv[1:]
names = {n for n in open(listing, "rb").read().decode().split("\0") if n}
# BENCH_COMPARE_DIR inside the tree (and not ignored) is not copied into itself.
rel_base = os.path.relpath(base, root)
if not rel_base.startswith(".."):
    names = {n for n in names if n != rel_base and not n.startswith(rel_base + os.sep)}
want = {n for n in names if os.path.isfile(os.path.join(root, n)) or os.path.islink(os.path.join(root, n))}
for d, dirs, files in os.walk(dest, topdown=False):
    rel = os.path.relpath(d, dest)
    for f in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
        r = os.path.normpath(os.path.join(rel, f))
        if r not in want:
            os.unlink(os.path.join(d, f))
    if d != dest and not os.listdir(d):
        os.rmdir(d)  # a directory the tree no longer has (a moved module, a removed crate)
copied = 0
for n in sorted(want):
    src, dst = os.path.join(root, n), os.path.join(dest, n)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.islink(src):
        if os.path.islink(dst) and os.readlink(dst) == os.readlink(src):
            continue
        if os.path.lexists(dst):
            os.unlink(dst)
        os.symlink(os.readlink(src), dst)
        copied += 1
        continue
    with open(src, "rb") as fh:
        data = fh.read()
    if os.path.isfile(dst) and not os.path.islink(dst):
        with open(dst, "rb") as fh:
            if fh.read() == data:
                continue
    elif os.path.lexists(dst):
        os.unlink(dst)
    with open(dst, "wb") as fh:
        fh.write(data)
    shutil.copymode(src, dst)
    copied += 1
print(f"{copied} of {len(want)} files changed since the last copy", file=sys.stderr)
PY
}

# build SIDE SHA -> sets B_BIN, the binary to run for that build.
build() {
    local side=$1 sha=$2 dir src
    if [ "$sha" = WORKTREE ]; then
        dir="$BASE/worktree-$(printf '%s' "$ROOT" | sha1sum | cut -c1-12)"
    else
        dir="$BASE/$sha"
    fi
    mkdir -p "$dir"
    src="$dir/src"
    B_BIN="$dir/natrix"
    exec {lockfd}>"$dir/.lock"
    if command -v flock >/dev/null; then flock "$lockfd"; fi
    if [ "$sha" != WORKTREE ] && [ "$REBUILD" = 0 ] && [ -x "$B_BIN" ]; then
        echo "$side: reusing $B_BIN (built $(date -r "$B_BIN" '+%F %T'); --rebuild to build again)" >&2
        exec {lockfd}>&-
        return
    fi
    if [ "$sha" = WORKTREE ]; then
        echo "$side: copying the working tree to $src" >&2
        sync_worktree "$src"
    elif [ ! -f "$dir/src.ok" ]; then
        echo "$side: exporting ${sha:0:12} to $src" >&2
        PARTIAL="$dir/src.partial"
        rm -rf "$src" "$PARTIAL"
        mkdir -p "$PARTIAL"
        git -C "$ROOT" archive --format=tar "$sha" | tar -x -C "$PARTIAL" ||
            die "could not export $sha"
        mv "$PARTIAL" "$src"
        PARTIAL=""
        touch "$dir/src.ok"
    fi
    echo "$side: cargo build --release -p natrix in $src (log: $dir/build.log)" >&2
    local start=$SECONDS
    if ! (cd "$src" && CARGO_TARGET_DIR="$dir/target" cargo build --release -p natrix) >"$dir/build.log" 2>&1; then
        tail -n 30 "$dir/build.log" >&2
        die "the build of $side (${sha:0:12}) failed; full log in $dir/build.log"
    fi
    cp "$dir/target/release/natrix" "$B_BIN.tmp"
    mv -f "$B_BIN.tmp" "$B_BIN"
    echo "$side: built in $((SECONDS - start)) s" >&2
    exec {lockfd}>&-
}

OLD_REF=${REFS[0]} NEW_REF=${REFS[1]}
resolve "$OLD_REF"; OLD_SHA=$R_SHA; OLD_LABEL=$R_LABEL
resolve "$NEW_REF"; NEW_SHA=$R_SHA; NEW_LABEL=$R_LABEL

build OLD "$OLD_SHA"; OLD_BIN=$B_BIN
build NEW "$NEW_SHA"; NEW_BIN=$B_BIN

# Builds from before `--order` existed can still be measured in creation
# order (their JSON has no "order" field and means creation order).
HAS_ORDER_OLD=1 HAS_ORDER_NEW=1
for side in OLD NEW; do
    bin_var=${side}_BIN
    # Captured first: `grep -q` closing the pipe early would fail it under pipefail.
    help=$("${!bin_var}" bench --help 2>&1) || die "the $side build (${!bin_var}) has no bench command: $help"
    if ! grep -q -- '--order' <<<"$help"; then
        eval "HAS_ORDER_$side=0"
        for o in "${ORDER_LIST[@]}"; do
            [ "$o" = created ] || die "the $side build has no bench --order; run it with --orders created"
        done
    fi
    grep -q -- '--workers' <<<"$help" || die "the $side build's bench has no --workers"
done

RAW="$TMP/runs.jsonl"
: >"$RAW"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${LOAD_BEFORE%% *}" 'BEGIN { exit !(l >= 1) }'; then
    echo "note: load average $LOAD_BEFORE; other work on this host widens the ranges (more --runs helps)" >&2
fi
STARTED=$(date '+%F %H:%M')
echo "measuring: $RUNS rounds x ${#ORDER_LIST[@]} orders x 2 builds, $FLOWS flows, $WORKERS worker(s)" >&2
for ((round = 1; round <= RUNS; round++)); do
    for order in "${ORDER_LIST[@]}"; do
        if ((round % 2)); then sides=(OLD NEW); else sides=(NEW OLD); fi
        for side in "${sides[@]}"; do
            bin_var=${side}_BIN sha_var=${side}_SHA ref_var=${side}_REF has_var=HAS_ORDER_$side
            cmd=("${!bin_var}" bench --flows "$FLOWS" --workers "$WORKERS" --json)
            [ "${!has_var}" = 1 ] && cmd+=(--order "$order")
            out="$TMP/run-$round-$order-$side"
            if ! "${cmd[@]}" >"$out.json" 2>"$out.err"; then
                cat "$out.err" >&2
                die "round $round, $order, $side failed: ${cmd[*]}"
            fi
            summary=$(python3 "$TMP/stats.py" run "$out.json" "$FLOWS" "$WORKERS" "$order" "$side" "$round" \
                "${!ref_var}" "${!sha_var}" "$RAW") ||
                die "round $round, $order, $side: unusable output from ${cmd[*]}"
            printf '  round %d/%d, %-7s %s: %s\n' "$round" "$RUNS" "$order" "$side" "$summary" >&2
        done
    done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
FINISHED=$(date '+%H:%M %Z')
[ -z "$JSON_OUT" ] || cp "$RAW" "$JSON_OUT"

lscpu_field() { lscpu 2>/dev/null | sed -n "s/^$1: *//p" | head -n1; }
CPU="$(lscpu_field 'Model name') (family $(lscpu_field 'CPU family'), model $(lscpu_field 'Model')), L3 $(lscpu_field 'L3 cache')"
CPUS=$(nproc)
cat <<EOF

\`$INVOCATION\`

- OLD: $OLD_LABEL
- NEW: $NEW_LABEL
- host: $CPU, $CPUS CPUs; $(uname -r); $(rustc --version 2>/dev/null || echo rustc unknown)
- date: $STARTED-$FINISHED; load average before $LOAD_BEFORE, after $LOAD_AFTER
- $RUNS rounds, each running both builds once per order, alternating (OLD first in odd rounds, NEW first in even ones):
  \`natrix bench --flows $FLOWS --workers $WORKERS --order ORDER --json\`, release builds

EOF
python3 "$TMP/stats.py" table "$RAW" "${ORDER_LIST[*]}" "$TOLERANCE"
