#!/usr/bin/env python3
"""Seed 001 section 5 (equation 1, table 2), reproduced by simulation.

An SCTP NAT that does not track global addresses tells associations apart by
tag (and port). Two internal hosts that draw the same tag (and port) towards
the same service collide: the second INIT is answered with an ABORT-M and its
host retries with a new tag. Seed 001 models each of the m lookup table
elements as a two-state Markov process and gets (equation 1)

    P[conflict] = sqrt(1 + (mu / 2 lambda)^2) - mu / 2 lambda,  lambda = Lambda / m,

with associations arriving at Lambda per second and held 1/mu = 180 s.

The simulation runs the system itself: Poisson arrivals, exponential holding
times, each attempt drawing its element uniformly from m, a colliding attempt
retrying at once with a fresh draw, as the hosts would after an ABORT-M. It
needs no table of m entries: the elements in use are a set. Since the
conflict probability depends on Lambda and m only through lambda / mu
(equation 1), each row runs scaled down by a factor k (Lambda / k arrivals
per second over m / k elements) to about 20,000 concurrent associations.
Each attempt contributes the probability that its uniform draw hits a busy
element (busy / m, its expectation given the state: the same mean as
counting hits, without waiting a billion draws for a 1e-7 event); hits are
counted too, for the rows where they are frequent.

usage: tools/sctp_conflicts.py [--seed N] [--arrivals N] [--json]
"""

import argparse
import heapq
import json
import math
import random

HOLD_S = 180.0
VTAG_SPACE = 2**32 - 1
VTAG_PORT_SPACE = (2**32 - 1) * 2**14
ARRIVALS = [10, 10**3, 10**5, 10**7]
# Seed 001, table 2.
SEED_TABLE = {
    ("vtag", 10): 4.2e-7, ("vtag", 10**3): 4.2e-5, ("vtag", 10**5): 4.2e-3, ("vtag", 10**7): 0.36,
    ("vtag/port", 10): 2.6e-11, ("vtag/port", 10**3): 2.6e-9, ("vtag/port", 10**5): 2.6e-7, ("vtag/port", 10**7): 2.6e-5,
}
TARGET_CONCURRENT = 20_000


def equation_1(arrivals_per_s, m, hold_s=HOLD_S):
    lam, mu = arrivals_per_s / m, 1 / hold_s
    x = mu / (2 * lam)
    # sqrt(1 + x^2) - x, written so that a large x loses no digits.
    return 1 / (math.sqrt(1 + x * x) + x)


def simulate(arrivals_per_s, m, rng, measured_arrivals, hold_s=HOLD_S):
    """(mean busy/m over attempts, hits/attempts, concurrent) of the scaled system."""
    k = max(1.0, arrivals_per_s * hold_s / TARGET_CONCURRENT)
    rate, space = arrivals_per_s / k, m / k
    busy = set()
    ends = []  # (time, element)
    t = 0.0
    warmup = 5 * hold_s  # the table fills in a few holding times
    attempts = hits = 0
    busy_sum = 0.0
    concurrent_sum = 0
    measured = 0
    while measured < measured_arrivals:
        t += rng.expovariate(rate)
        while ends and ends[0][0] <= t:
            busy.discard(heapq.heappop(ends)[1])
        counting = t >= warmup
        while True:
            element = rng.randrange(int(space))
            if counting:
                attempts += 1
                busy_sum += len(busy) / space
            if element not in busy:
                break
            hits += counting
        busy.add(element)
        heapq.heappush(ends, (t + rng.expovariate(1 / hold_s), element))
        if counting:
            measured += 1
            concurrent_sum += len(busy)
    return busy_sum / attempts, hits / attempts, concurrent_sum / measured * k


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arrivals", type=int, default=200_000, help="arrivals measured per row")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for space_name, m in (("vtag", VTAG_SPACE), ("vtag/port", VTAG_PORT_SPACE)):
        for a in ARRIVALS:
            p_sim, p_hits, concurrent = simulate(a, m, rng, args.arrivals)
            rows.append({"state_space": space_name, "arrivals_per_s": a, "concurrent": concurrent, "seed_table_2": SEED_TABLE[(space_name, a)],
                         "equation_1": equation_1(a, m), "simulated": p_sim, "simulated_hits": p_hits})
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"{'state space':<10} {'arrivals/s':>10} {'concurrent':>11} {'seed table 2':>13} {'equation 1':>11} {'simulated':>10} {'hits':>10}")
    for r in rows:
        print(f"{r['state_space']:<10} {r['arrivals_per_s']:>10.0e} {r['concurrent']:>11.2e} {r['seed_table_2']:>13.2e} "
              f"{r['equation_1']:>11.2e} {r['simulated']:>10.2e} {r['simulated_hits']:>10.2e}")


if __name__ == "__main__":
    main()
