#!/bin/bash
N=/work/main/target/release/natrix
$N lab down >/dev/null 2>&1
$N lab up --kernel >/dev/null || exit 1
ip netns exec nx-sub1 ethtool -K eth0 $OFFL >/dev/null 2>&1
for d in nx-sub1 nx-nat-in; do ip netns exec nx-sw ethtool -K $d $OFFL >/dev/null 2>&1; done
ip netns exec nx-srv1 iperf3 -s -1 -B 198.51.100.11 -p 5201 >/dev/null 2>&1 &
sleep 1
timeout 12 ip netns exec nx-sub1 iperf3 -c 198.51.100.11 -t 3 -p 5201 2>&1 | grep -E "sender|receiver"
$N lab down >/dev/null 2>&1
