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
frame (data and ACKs), frames counted.

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


def idle_ns(cpu):
    """CPU `cpu`'s idle, I/O-wait and stolen time, in ns."""
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                fields = [int(x) for x in line.split()[1:]]
                return (fields[3] + fields[4] + fields[7]) * 1e9 / hz
    raise SystemExit(f"no cpu{cpu} in /proc/stat")


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
            samples.append((time.clock_gettime_ns(time.CLOCK_MONOTONIC), idle_ns(args.cpu), frames))
        time.sleep(0.25)
    gbps = [json.loads(l)["tcp_throughput"]["gbps"] for l in test.stdout.read().splitlines() if '"tcp_throughput"' in l]
    busy = counted = 0
    for (t0, i0, f0), (t1, i1, f1) in zip(samples, samples[1:]):
        if (f1 - f0) / ((t1 - t0) / 1e9) > BUSY_FRAMES_PER_S:
            busy += (t1 - t0) - (i1 - i0)
            counted += f1 - f0
    print(json.dumps({"device": args.device, "gbps": gbps[0] if gbps else None,
                      "cpu_ns_per_frame": busy / counted if counted else None, "frames": counted}))


if __name__ == "__main__":
    main()
