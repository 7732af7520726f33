#!/usr/bin/env bash
# One natrix build forwarding in the namespace lab at a fixed offered rate,
# one worker on CPU 1, the generator and receiver (`natrix gen`) on CPU 0:
# what arrives, and the CPU ticks natrix (and, THREADED=1, its links' NAPI
# threads, pinned to CPU 1) spent over 4 s. Root; takes the lab lock.
#   sudo N=target/release/natrix RATE=300000 SIZE=1518 THREADED=0 scripts/overload-forwarding.sh
set -u
exec 9>/tmp/natrix-lab.lock; flock 9
N=${N:-target/release/natrix}; RATE=${RATE:-50000}; THREADED=${THREADED:-0}; TAG=${TAG:-run}
$N lab up --config-out /tmp/natrix-overload.toml >/dev/null 2>&1
MAC=$(ip -n nx-nat -o link show inside | sed 's/.*link\/ether \([^ ]*\).*/\1/')
ip netns exec nx-nat taskset -c 1 nice -n -5 $N run --config /tmp/natrix-overload.toml > /tmp/natrix-overload.log 2>&1 &
sleep 2
if [ "$THREADED" = 1 ]; then
 for d in inside outside; do ip netns exec nx-nat sh -c "echo 1 > /sys/class/net/$d/threaded"; done
 for p in $(pgrep -f "napi/"); do taskset -p 2 $p >/dev/null; done
fi
NP=$(pgrep -f "$N run" | tail -1)
ip netns exec nx-srv1 taskset -c 0 $N gen --interface eth0 --receive --dst 198.51.100.11 --duration 12 > /tmp/natrix-overload-recv.log 2>&1 &
sleep 1
ip netns exec nx-sub1 taskset -c 0 $N gen --interface eth0 --rate $RATE --duration 8 --dst 198.51.100.11 --dst-mac $MAC --flows 1000 --size ${SIZE:-64} > /tmp/natrix-overload-send.log 2>&1 &
sleep 3
cpu() { local t=0; for p in $NP $(pgrep -f "napi/"); do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
nat() { awk '{print $14+$15}' /proc/$NP/stat; }
[ -n "${PERF:-}" ] && perf record -F 3000 -e cpu-clock -g -p "$NP" -o "/tmp/perf-$TAG.data" -- sleep 3 >/dev/null 2>&1 &
a=$(cpu); an=$(nat); s1=$(awk '/^cpu1 /{print $7}' /proc/stat); sleep 4; b=$(cpu); bn=$(nat); s2=$(awk '/^cpu1 /{print $7}' /proc/stat)
echo "ticks natrix+napi over 4s: $((b-a)) (natrix alone $((bn-an))); cpu1 softirq ticks $((s2-s1)); rate $RATE"
sleep 6
kill %1; wait
grep -h "sent\|received" /tmp/natrix-overload-send.log /tmp/natrix-overload-recv.log | head -3
$N lab down >/dev/null 2>&1
