#!/usr/bin/env python3
"""The device's CPU per forwarded frame during `natrix test --tests tcp`.

On a host where the lab's CPU limits TCP for every device, throughput
says little about the device; its CPU per frame does. This runs one
`natrix test --tests tcp` (its own lab, under the lab lock) and samples,
every 0.25 s, the device CPU's time not idle (CLOCK_MONOTONIC less the
idle, I/O-wait and stolen time of /proc/stat, as the tester counts it)
and the frames the switch's peers of the device's links received from
it. Over the intervals that carried more than 100 k frames a second it
prints one JSON line: the device, iperf3's Gbit/s, CPU nanoseconds per
frame (data and ACKs), frames counted, and each CPU's busy share over
those intervals (the lab's CPUs too: where they are full, the lab, not
the device, is the limit).

    scripts/tcp-cpu-per-frame.py kernel|CONFIG [--natrix PATH] [--cpu N]

CONFIG: a natrix configuration for the lab (`natrix test --config`).
Needs root, as `natrix test` does.
"""

import argparse
import json
import os
import subprocess
import time

SWITCH_PEERS = ("nx-nat-in", "nx-nat-out")
BUSY_FRAMES_PER_S = 100e3


def idle_ns():
    """Each CPU's idle, I/O-wait and stolen time, in ns, by CPU number."""
    hz = os.sysconf("SC_CLK_TCK")
    idle = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu":
                f = [int(x) for x in fields]
                idle[int(name[3:])] = (f[3] + f[4] + f[7]) * 1e9 / hz
    return idle


def switch_frames():
    """Frames nx-sw's peers of the device's links received; None before the lab is up."""
    total = 0
    for dev in SWITCH_PEERS:
        out = subprocess.run(["ip", "netns", "exec", "nx-sw", "cat", f"/sys/class/net/{dev}/statistics/rx_packets"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None
        total += int(out.stdout)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("device", help="kernel, or natrix's configuration file")
    ap.add_argument("--natrix", default="target/release/natrix")
    ap.add_argument("--cpu", type=int, default=1, help="the device's CPU (natrix test gives it CPU 1 on a 2-CPU host)")
    args = ap.parse_args()
    dut = ["--dut", "kernel"] if args.device == "kernel" else ["--dut", "natrix", "--config", args.device]
    test = subprocess.Popen(["flock", "/tmp/natrix-lab.lock", args.natrix, "test", *dut, "--tests", "tcp", "--json",
                             "--out", "/tmp/tcp-cpu-per-frame"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    samples = []
    while test.poll() is None:
        frames = switch_frames()
        if frames is not None:
            samples.append((time.clock_gettime_ns(time.CLOCK_MONOTONIC), idle_ns(), frames))
        time.sleep(0.25)
    gbps = [json.loads(l)["tcp_throughput"]["gbps"] for l in test.stdout.read().splitlines() if '"tcp_throughput"' in l]
    busy, elapsed, counted = {}, 0, 0
    for (t0, i0, f0), (t1, i1, f1) in zip(samples, samples[1:]):
        if (f1 - f0) / ((t1 - t0) / 1e9) > BUSY_FRAMES_PER_S:
            elapsed += t1 - t0
            counted += f1 - f0
            for cpu in i1:
                busy[cpu] = busy.get(cpu, 0) + (t1 - t0) - (i1[cpu] - i0[cpu])
    print(json.dumps({"device": args.device, "gbps": gbps[0] if gbps else None,
                      "cpu_ns_per_frame": busy[args.cpu] / counted if counted else None, "frames": counted,
                      "cpu_busy": {cpu: round(b / elapsed, 3) for cpu, b in busy.items()} if elapsed else None}))


if __name__ == "__main__":
    main()
