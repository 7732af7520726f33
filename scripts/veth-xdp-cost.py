#!/usr/bin/env python3
"""What an XDP program on the device's veths costs TCP in the lab,
whatever the program does.

Alternates, round after round, `natrix test --tests tcp --json` on:

  kernel           the kernel's nftables NAT (`natrix lab up --kernel`)
  kernel-xdp-pass  the same, with a two-instruction XDP program that
                   passes every frame attached to nx-nat's inside and
                   outside (native mode), their NAPI threaded and its
                   threads on the device's CPU 1 at SCHED_FIFO 50, as
                   `natrix test` runs natrix's
  natrix           natrix (its own lab; --config FILE as `natrix test`)

and prints each run's `tcp_throughput` object as one JSON line with the
variant's name. veth runs an XDP program on a frame only after copying it
into a page of its own (veth_convert_skb_to_xdp_buff); what the kernel's
forwarding loses to that copy, and what the lab's receivers then spend
on those frames, is what natrix pays on veth before its first
instruction. A NIC's driver puts frames in such pages to begin with.

    sudo scripts/veth-xdp-cost.py [--rounds N] [--natrix PATH] [--config FILE]
"""

import argparse
import ctypes
import fcntl
import json
import os
import struct
import subprocess
import sys
import tempfile

SYS_BPF = 321  # x86-64
BPF_PROG_LOAD, BPF_OBJ_PIN = 5, 6
BPF_PROG_TYPE_XDP = 6
XDP_PASS = 2
LAB_LOCK = "/tmp/natrix-lab.lock"
DEVICE_CPU = 1  # natrix test's for one worker


def bpf(cmd, attr):
    libc = ctypes.CDLL(None, use_errno=True)
    ret = libc.syscall(SYS_BPF, cmd, attr, len(attr))
    if ret < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return ret


def pin_pass_program(path):
    """Loads `r0 = XDP_PASS; exit` and pins it at `path` on a bpffs."""
    insns = ctypes.create_string_buffer(struct.pack("<BBhi", 0xb7, 0, 0, XDP_PASS) + struct.pack("<BBhi", 0x95, 0, 0, 0))
    license = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("<IIQQ", attr, 0, BPF_PROG_TYPE_XDP, 2, ctypes.addressof(insns), ctypes.addressof(license))
    fd = bpf(BPF_PROG_LOAD, attr)
    try:
        name = ctypes.create_string_buffer(path.encode())
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("<QI", attr, 0, ctypes.addressof(name), fd)
        bpf(BPF_OBJ_PIN, attr)
    finally:
        os.close(fd)


def natrix(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True)


def tcp_run(exe, dut, config):
    cmd = ["test", "--dut", dut, "--tests", "tcp", "--json", "--out", "/tmp/veth-xdp-cost"]
    if config and dut == "natrix":
        cmd += ["--config", config]
    out = natrix(exe, *cmd)
    lines = [json.loads(l) for l in out.stdout.splitlines() if '"tcp_throughput"' in l]
    if not lines:
        sys.exit(f"natrix test --dut {dut} gave no TCP result:\n{out.stderr[-2000:]}")
    return {**lines[0]["tcp_throughput"], "generator_limited": lines[0]["generator_limited"]}


def run_variant(exe, variant, program, config):
    natrix(exe, "lab", "down")
    if variant == "natrix":
        return tcp_run(exe, "natrix", config)
    up = natrix(exe, "lab", "up", "--kernel")
    if up.returncode != 0:
        sys.exit(f"natrix lab up --kernel: {up.stderr.strip()}")
    if variant == "kernel-xdp-pass":
        for dev in ("inside", "outside"):
            subprocess.run(["ip", "-n", "nx-nat", "link", "set", "dev", dev, "xdpdrv", "pinned", program], check=True)
        napi_on_device_cpu()
    return tcp_run(exe, "kernel", config)


def comm(pid):
    """A process's name; "" for one gone meanwhile."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read()
    except OSError:
        return ""


def napi_on_device_cpu():
    """nx-nat's veths' receive work (veth's copy and the program) in NAPI
    threads on CPU 1, the device's, ahead of other threads: where natrix
    test puts natrix's, rather than on the CPU that sends, the lab's."""
    for dev in ("inside", "outside"):
        subprocess.run(["ip", "netns", "exec", "nx-nat", "sh", "-c", f"echo 1 > /sys/class/net/{dev}/threaded"], check=True)
    threads = [p for p in os.listdir("/proc") if p.isdigit() and comm(p).startswith(("napi/inside-", "napi/outside-"))]
    if not threads:
        sys.exit("no NAPI threads of nx-nat's inside or outside")
    for pid in threads:
        os.sched_setaffinity(int(pid), {DEVICE_CPU})
        os.sched_setscheduler(int(pid), os.SCHED_FIFO, os.sched_param(50))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--natrix", default="target/release/natrix")
    ap.add_argument("--config", help="natrix's configuration (default: the tester's)")
    args = ap.parse_args()
    lock = open(LAB_LOCK, "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    # ip mounts its own /sys for a namespace, so the pin lives elsewhere.
    bpffs = tempfile.mkdtemp(prefix="veth-xdp-cost-", dir="/run")
    subprocess.run(["mount", "-t", "bpf", "bpf", bpffs], check=True)
    try:
        program = os.path.join(bpffs, "pass")
        pin_pass_program(program)
        for _ in range(args.rounds):
            for variant in ("kernel", "kernel-xdp-pass", "natrix"):
                print(json.dumps({"variant": variant, **run_variant(args.natrix, variant, program, args.config)}), flush=True)
    finally:
        natrix(args.natrix, "lab", "down")
        subprocess.run(["umount", bpffs])
        os.rmdir(bpffs)


if __name__ == "__main__":
    main()
