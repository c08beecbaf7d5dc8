"""Benchmark: stationary distributions of many generators, GTH against the usual baselines.

Run: python scripts/bench_stationary.py [--count 10000] [--states 16] [--rounds 5]

Speed: `count` random irreducible generators with `states` states, timed interleaved in each
round (GTH batched, batched LU, a Python loop over scipy.linalg.null_space); medians and ratios.
Accuracy: the largest relative error of each method on a 40-state birth-death chain with rate
ratio 0.1 (entries of p_st from 1 down to 1e-39) against its closed form.
Targets (issue 2): GTH >= 30x faster than the null_space loop; GTH relative error <= 1e-12.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import scipy.linalg

import fastslow_sim as fs


def null_space_loop(Q):
    out = np.empty(Q.shape[:-1])
    for b in range(Q.shape[0]):
        v = scipy.linalg.null_space(Q[b].T)[:, 0]
        out[b] = v / v.sum()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--states", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    Q = fs.random_generators(args.count, args.states, seed=args.seed)
    runners = {
        "gth (batched)": lambda: fs.stationary_distribution(Q, "gth"),
        "lu (batched)": lambda: fs.stationary_distribution(Q, "lu"),
        "null_space loop": lambda: null_space_loop(Q),
    }
    for fn in runners.values():  # warm-up (imports, allocator)
        fn() if fn is not runners["null_space loop"] else null_space_loop(Q[:100])
    times = {k: [] for k in runners}
    results = {}
    for _ in range(args.rounds):
        for name, fn in runners.items():  # interleaved: every round runs each method once
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    ref = results["gth (batched)"]

    bd = fs.BirthDeath(n=40, up=0.1, down=1.0, beta=0.0)
    Qbd, exact = bd.rates(0.0), bd.closed_form(0.0)
    acc = {
        "gth (batched)": fs.stationary_distribution(Qbd, "gth"),
        "lu (batched)": fs.stationary_distribution(Qbd, "lu"),
        "null_space loop": null_space_loop(Qbd[None])[0],
    }

    print(
        f"# bench_stationary: {args.count} generators x {args.states} states, {args.rounds} "
        f"interleaved rounds; python {platform.python_version()}, numpy {np.__version__}, "
        f"scipy {scipy.__version__}, {os.cpu_count()} cpus"
    )
    med_ns = np.median(times["null_space loop"])
    print(
        "| method | median time (s) | speed-up vs null_space loop | max |p - p_gth| | "
        "max rel. error, 40-state chain |"
    )
    print("|---|---:|---:|---:|---:|")
    for name in runners:
        med = np.median(times[name])
        agree = np.max(np.abs(results[name] - ref))
        rel = np.max(np.abs(acc[name] - exact) / exact)
        print(f"| {name} | {med:.4f} | {med_ns / med:.1f}x | {agree:.1e} | {rel:.2e} |")
    ratio = med_ns / np.median(times["gth (batched)"])
    rel_gth = np.max(np.abs(acc["gth (batched)"] - exact) / exact)
    print(
        f"targets: GTH speed-up >= 30x: {'met' if ratio >= 30 else 'NOT met'} ({ratio:.1f}x); "
        f"GTH rel. error <= 1e-12: {'met' if rel_gth <= 1e-12 else 'NOT met'} ({rel_gth:.1e})"
    )


if __name__ == "__main__":
    main()
