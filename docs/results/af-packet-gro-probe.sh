#!/bin/bash
# natrix on AF_PACKET with GRO on natrix's inside (as a NIC has it by default).
N=/work/main/target/release/natrix
$N lab down >/dev/null 2>&1
$N lab up >/dev/null || exit 1
sed "s/^io = .*/io = \"af_packet\"/" /run/natrix-lab/natrix.toml > /tmp/gro.toml
grep -q '^io' /tmp/gro.toml || sed -i 's/^workers = 1/workers = 1\nio = "af_packet"/' /tmp/gro.toml
ip netns exec nx-nat ethtool -K inside gro $GRO
ip netns exec nx-nat ethtool -k inside | grep generic-receive
ip netns exec nx-srv1 iperf3 -s -1 -B 198.51.100.11 -p 5201 >/dev/null 2>&1 &
ip netns exec nx-nat $N run --config /tmp/gro.toml > /tmp/gro.log 2>&1 &
PID=$!
sleep 3
timeout 12 ip netns exec nx-sub1 iperf3 -c 198.51.100.11 -t 3 -p 5201 2>&1 | grep -E "sender|receiver|error"
ip netns exec nx-nat curl -s 127.0.0.1:9300/metrics | grep -E "^natrix_rx_refused_total"
ip netns exec nx-nat ethtool -k inside | grep generic-receive
kill $PID; wait $PID
grep -i "af_packet\|GRO" /tmp/gro.log | head -5
ip netns exec nx-nat ethtool -k inside | grep generic-receive
$N lab down >/dev/null 2>&1
