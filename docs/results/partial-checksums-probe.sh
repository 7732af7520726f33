#!/bin/bash
MODE=$1
N=/work/main/target/release/natrix
$N lab down >/dev/null 2>&1
$N lab up >/dev/null || exit 1
sed "s/^workers = 1/workers = 1\nxdp_mode = \"$MODE\"/" /run/natrix-lab/natrix.toml > /tmp/gso-$MODE.toml
# A sender as a container's veth sends by default: TSO/GSO and checksum offload on.
ip netns exec nx-sub1 ethtool -K eth0 $OFFL >/dev/null 2>&1
for d in nx-sub1 nx-nat-in; do ip netns exec nx-sw ethtool -K $d $OFFL >/dev/null 2>&1; done
ip netns exec nx-sw ethtool -k nx-nat-in | grep -E "segmentation|tx-checksumming"
ip netns exec nx-nat $N run --config /tmp/gso-$MODE.toml > /tmp/gso-$MODE.log 2>&1 &
PID=$!
ip netns exec nx-srv1 iperf3 -s -1 -B 198.51.100.11 -p 5201 >/dev/null 2>&1 &
sleep 3
timeout 12 ip netns exec nx-sub1 iperf3 -c 198.51.100.11 -t 3 -p 5201 2>&1 | tail -4
ip netns exec nx-nat ip -s link show inside | head -8
curl -s 127.0.0.1:9300/metrics 2>/dev/null | grep -E "^natrix_(rx_checksums_completed|offloaded_packets|rx_kernel_dropped|rx_refused)" ; ip netns exec nx-nat curl -s 127.0.0.1:9300/metrics | grep -E "^natrix_(rx_checksums_completed|offloaded_packets|rx_kernel_dropped|rx_refused)"
kill $PID; wait $PID
grep -i "drop\|mode\|copy" /tmp/gso-$MODE.log | head
$N lab down >/dev/null 2>&1
