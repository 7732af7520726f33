#!/usr/bin/env python3
"""One half of scripts/side-by-side.sh: measures the NAT in the lab that
`natrix lab up` built (natrix, or the Linux kernel after `natrix lab up
--kernel`) and writes the figures as JSON.

All traffic goes from nx-sub1 through nx-nat to nx-srv1:
- TCP: iperf3 for --tcp-seconds.
- 64-byte UDP frames from trafgen over --flows established flows, then
  frames that each open a new flow (pseudorandom subscriber addresses and
  ports, after RFC 4814).
For each UDP test: one trial at full blast, then a binary search over
offered rates for the highest one with loss under 0.1% (CONTRACTS.md: veth
and the generator cap both sides, so the full-blast figure alone says
little). trafgen's own rate option sends each second's quota back to back,
so rates are set by a tbf qdisc on nx-sub1's eth0, which lets at most
BURST_FRAMES frames through back to back. Offered = frames that left
nx-sub1's eth0; delivered = frames counted on arrival in nx-srv1.

Usage: measure.py --mode natrix|kernel [--natrix-bin BIN --config FILE] --out FILE.json
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

NAT, SUB, SRV = "nx-nat", "nx-sub1", "nx-srv1"
SUB_ADDR, SRV_ADDR = "100.64.0.2", "198.51.100.11"
LOSS_OK = 0.001
FRAME_BYTES = 60  # a 64-byte Ethernet frame as the kernel counts it: without FCS
BURST_FRAMES = 64
# Frames the tbf queues behind the bucket. Queued frames hold trafgen's
# socket memory; past the default send buffer trafgen's TX_RING flush fails
# with EAGAIN and trafgen exits, so the queue stays short.
QUEUE_FRAMES = 128
# natrix's default max_sessions is 1,048,576: a new-flow trial stays below,
# so the table never fills within one trial.
NEW_FLOWS_PER_TRIAL = 900_000
# The lab's natrix configuration gives one subscriber 2000 ports; the
# established flows all come from nx-sub1.
MAX_FLOWS = 2000
READY_TIMEOUT = 20
DRAIN_SECONDS = 0.5
COUNTER_TABLE = "natrix_side_by_side"
HERE = os.path.dirname(os.path.abspath(__file__))


class NatFailed(Exception):
    """The NAT under test cannot be measured (natrix never ready, or gone)."""


def netns(ns, *argv, timeout=60, check=True, cwd=None):
    r = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True,
                       timeout=timeout, cwd=cwd)
    if check and r.returncode != 0:
        raise RuntimeError(f"{ns}: `{' '.join(argv)}` failed: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- the NAT under test -----------------------------------------------------

class Natrix:
    """`natrix run` in nx-nat; its output goes to a log file."""

    def __init__(self, binary, config, log_path):
        self.binary, self.config, self.log_path = binary, config, log_path
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["ip", "netns", "exec", NAT, self.binary, "run", "--config", self.config],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(self.proc, ready), daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready.wait(0.1):
            if self.proc.poll() is not None:
                raise NatFailed(f"natrix exited with status {self.proc.returncode} without printing "
                                f"a line containing 'ready'{self._tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise NatFailed(f"natrix printed no line containing 'ready' within {READY_TIMEOUT} s{self._tail()}")

    def _pump(self, proc, ready):
        with open(self.log_path, "a") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                if "natrix: ready:" in line:
                    ready.set()

    def _tail(self):
        time.sleep(0.2)  # let the pump write what natrix said last
        with open(self.log_path) as f:
            lines = f.read().splitlines()[-8:]
        return "".join(f"\n    natrix: {line}" for line in lines)

    def check(self):
        if self.proc.poll() is not None:
            raise NatFailed(f"natrix exited with status {self.proc.returncode} during the measurements{self._tail()}")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def reset(self):
        """An empty mapping table: natrix restarted."""
        self.stop()
        self.start()


class Kernel:
    """nx-nat as a Linux router with nftables masquerade: nothing to start."""

    def start(self):
        pass

    def check(self):
        pass

    def stop(self):
        pass

    def reset(self):
        """An empty conntrack table, as natrix has after its restart."""
        netns(NAT, sys.executable, os.path.join(HERE, "ct_flush.py"))


# ---- the lab ----------------------------------------------------------------

def mac(ns, dev):
    return netns(ns, "cat", f"/sys/class/net/{dev}/address").strip()


def steer_receive_off_cpu0():
    """trafgen runs on CPU 0 (-P 1 pins it there) and veth hands each frame
    on in the sender's softirq; RPS moves the NAT namespace's receive work,
    kernel forwarding or natrix's AF_PACKET delivery alike, to the other
    CPUs, as a NIC would deliver it away from the generator."""
    cpus = os.cpu_count() or 1
    if cpus < 2:
        return
    mask = format(((1 << cpus) - 1) & ~1, "x")
    for dev in ("inside", "outside"):
        netns(NAT, "sh", "-c", f"echo {mask} > /sys/class/net/{dev}/queues/rx-0/rps_cpus")


def install_arrival_counter():
    """Counts, then drops, UDP as it enters nx-srv1: before any socket, so
    the count is what crossed the NAT and srv1 sends no ICMP back."""
    t = COUNTER_TABLE
    netns(SRV, "nft", f"add table ip {t}; "
                      f"add chain ip {t} in {{ type filter hook prerouting priority raw; }}; "
                      f"add rule ip {t} in iifname \"eth0\" meta l4proto udp counter drop")


def arrivals():
    listing = json.loads(netns(SRV, "nft", "-j", "list", "table", "ip", COUNTER_TABLE))
    for item in listing["nftables"]:
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                return expr["counter"]["packets"]
    raise RuntimeError(f"no counter in nx-srv1's table {COUNTER_TABLE}")


def departures():
    return int(netns(SUB, "cat", "/sys/class/net/eth0/statistics/tx_packets"))


def shape(rate):
    """A tbf on nx-sub1's eth0 letting `rate` frames/s through, or none."""
    if rate is None:
        subprocess.run(["tc", "-n", SUB, "qdisc", "del", "dev", "eth0", "root"], capture_output=True)
        return
    subprocess.run(["tc", "-n", SUB, "qdisc", "replace", "dev", "eth0", "root", "tbf",
                    "rate", f"{int(rate * FRAME_BYTES * 8)}bit", "burst", str(BURST_FRAMES * FRAME_BYTES),
                    "limit", str(QUEUE_FRAMES * FRAME_BYTES)], check=True, capture_output=True)


def write_trafgen_configs(workdir, flows):
    """Two trafgen packet configs (60-byte UDP frames to nx-srv1's discard
    port); trafgen fills in lengths and checksums."""
    eth = f"eth(da={mac(NAT, 'inside')}, sa={mac(SUB, 'eth0')})"
    established = (f"{{ {eth}, ipv4(sa={SUB_ADDR}, da={SRV_ADDR}, ttl=64), "
                   f"udp(sp=dinc(10000, {10000 + flows - 1}), dp=9), fill(0, 18) }}\n")
    # Subscribers 100.64.1.0-100.64.127.255 (not the NAT's own 100.64.0.1),
    # pseudorandom source (1024-65535) and destination (1-49151) ports after
    # RFC 4814 section 4.5: each frame is, in effect, a new flow.
    new = (f"{{ {eth}, ipv4(sa=100.64.0.0, sa[2]=drnd(1, 127), sa[3]=drnd(), da={SRV_ADDR}, ttl=64), "
           f"udp(sp=drnd(1024, 65535), dp=drnd(1, 49151)), fill(0, 18) }}\n")
    paths = {}
    for name, text in (("established", established), ("new", new)):
        paths[name] = os.path.join(workdir, f"{name}.trafgen")
        with open(paths[name], "w") as f:
            f.write(text)
    return paths


# ---- trials -----------------------------------------------------------------

def trafgen(workdir, cfg, seconds, extra=()):
    """Runs trafgen in nx-sub1 on CPU 0; returns how long it sent, in seconds."""
    argv = ["timeout", "-s", "INT", "-k", "5", f"{seconds:.3f}", "trafgen", "-i", cfg, "-o", "eth0",
            "-P", "1", "--no-sock-mem", "-Q", *extra]
    # trafgen leaves a scratch file in its working directory.
    out = netns(SUB, *argv, check=False, timeout=seconds + 30, cwd=workdir)
    m = re.search(r"(\d+) sec, (\d+) usec on CPU", out)
    if not m:
        raise RuntimeError(f"trafgen reported nothing: {out.strip()[-300:]}")
    return int(m.group(1)) + int(m.group(2)) / 1e6


def trial(workdir, cfg, seconds, rate=None, count=0):
    """One trafgen run: at full blast (rate None), or shaped to `rate` frames/s."""
    shape(rate)
    sent0, got0 = departures(), arrivals()
    extra = ["-q"] if rate else []  # through the qdisc, so the tbf applies
    if count:
        extra += ["-n", str(count)]
    secs = trafgen(workdir, cfg, seconds, extra)
    time.sleep(DRAIN_SECONDS)
    sent, got = departures() - sent0, arrivals() - got0
    secs = max(secs, 1e-3)
    return {"shaped_pps": rate, "offered_pps": sent / secs, "delivered_pps": got / secs,
            "loss": (1 - got / sent) if sent else 1.0, "sent": sent, "received": got, "seconds": secs}


def describe(t):
    how = "full blast" if t["shaped_pps"] is None else f"shaped {t['shaped_pps'] / 1e3:7.1f} kpps"
    return (f"{how}: offered {t['offered_pps'] / 1e3:7.1f} kpps, delivered {t['delivered_pps'] / 1e3:7.1f} kpps, "
            f"loss {100 * t['loss']:.3f}%")


def warm_up(workdir, cfg, flows):
    """Two slow passes over the established flows: the NAT has their
    mappings and has resolved srv1's MAC before anything is timed."""
    trafgen(workdir, cfg, 10, ["-n", str(2 * flows), "-t", "20us"])
    time.sleep(DRAIN_SECONDS)


def rate_test(name, cfg, args, nat, fresh):
    """Full blast, then a binary search on shaped rates for the highest
    offered rate with loss under LOSS_OK. With `fresh` (new flows), every
    trial starts from an empty table and sends at most NEW_FLOWS_PER_TRIAL
    frames."""
    def run(rate):
        if fresh:
            nat.reset()
            warm_up(args.workdir, args.cfgs["established"], args.flows)
        seconds = args.trial_seconds
        count = 0
        if fresh and rate is None:
            count = NEW_FLOWS_PER_TRIAL
        elif fresh:
            seconds = min(seconds, NEW_FLOWS_PER_TRIAL / rate)
        t = trial(args.workdir, cfg, seconds, rate, count)
        nat.check()
        log(f"  {args.mode:<7} {name:<12} {describe(t)}")
        return t

    full = run(None)
    best = full if full["loss"] < LOSS_OK else None
    lo, hi = 0.0, full["offered_pps"]
    for _ in range(0 if best else args.steps):
        rate = (lo + hi) / 2
        t = run(rate)
        if t["loss"] < LOSS_OK:
            lo = rate
            if best is None or t["offered_pps"] > best["offered_pps"]:
                best = t
        else:
            hi = rate
    return {"full_blast": full, "no_loss": best}


def tcp(seconds):
    server = subprocess.Popen(["ip", "netns", "exec", SRV, "iperf3", "-s", "-1", "-B", SRV_ADDR],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5
        while not netns(SRV, "ss", "-Hltn", "sport = :5201").strip():
            if time.monotonic() > deadline:
                return {"error": "iperf3 server did not start"}
            time.sleep(0.1)
        out = netns(SUB, "iperf3", "-c", SRV_ADDR, "-t", str(seconds), "-J", "--connect-timeout", "3000",
                    check=False, timeout=seconds + 30)
    finally:
        server.kill()
        server.wait()
    try:
        result = json.loads(out)
    except json.JSONDecodeError:
        return {"error": "iperf3 printed no result"}
    if "error" in result:
        return {"error": result["error"]}
    end = result["end"]
    t = {"gbps": end["sum_received"]["bits_per_second"] / 1e9, "retransmits": end["sum_sent"].get("retransmits", 0)}
    log(f"  {'':<7} {'tcp':<12} {t['gbps']:.2f} Gbit/s, {t['retransmits']} retransmits")
    return t


def measure(args, nat):
    result = {"mode": args.mode, "flows": args.flows, "trial_seconds": args.trial_seconds,
              "tcp_seconds": args.tcp_seconds, "cpus": os.cpu_count()}
    try:
        nat.start()
        steer_receive_off_cpu0()
        install_arrival_counter()
        args.cfgs = write_trafgen_configs(args.workdir, args.flows)
        warm_up(args.workdir, args.cfgs["established"], args.flows)
        result["tcp"] = tcp(args.tcp_seconds)
        nat.check()
        result["established"] = rate_test("established", args.cfgs["established"], args, nat, fresh=False)
        result["new_flows"] = rate_test("new flows", args.cfgs["new"], args, nat, fresh=True)
    except (NatFailed, RuntimeError, subprocess.SubprocessError) as e:
        # What was measured so far still makes it into the table.
        result["error"] = str(e)
        log(f"  {args.mode}: {e}")
    finally:
        nat.stop()
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["natrix", "kernel"], required=True)
    p.add_argument("--natrix-bin", help="natrix binary (natrix mode)")
    p.add_argument("--config", help="natrix's configuration for the lab (natrix mode)")
    p.add_argument("--tcp-seconds", type=int, default=10)
    p.add_argument("--trial-seconds", type=float, default=3)
    p.add_argument("--steps", type=int, default=6, help="binary search steps per rate test")
    p.add_argument("--flows", type=int, default=1000,
                   help=f"established flows, all from one subscriber: at most {MAX_FLOWS}")
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if not 1 <= args.flows <= MAX_FLOWS:
        p.error(f"--flows must be 1 to {MAX_FLOWS}")
    if args.mode == "natrix":
        if not (args.natrix_bin and args.config):
            p.error("natrix mode needs --natrix-bin and --config")
        nat = Natrix(args.natrix_bin, args.config, os.path.join(args.workdir, "natrix.log"))
    else:
        nat = Kernel()
    result = measure(args, nat)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
