"""Benchmark: stationary distributions of many generators, GTH against the usual baselines.

Run: python scripts/bench_stationary.py [--count 10000] [--states 16] [--rounds 5]

Speed: `count` random irreducible generators with `states` states, timed interleaved in each
round (GTH batched, the same GTH without its compiled kernel, batched LU, a Python loop over
scipy.linalg.null_space); medians and ratios. Every table calls each timed function once,
untimed, before its rounds (a compiled kernel's first call loads it: 15.6 ms a point against
0.27 warm in one round of the chain table).
Accuracy: the largest relative error of each method on a 40-state birth-death chain with rate
ratio 0.1 (entries of p_st from 1 down to 1e-39) against its closed form.
Targets (issue 2): GTH >= 30x faster than the null_space loop; GTH relative error <= 1e-12.

Neighbour chains (`--chain-states`, no target): `p_st` of the birth-death chain at `points`
values of y, as `MasterEquationSystem.critical_manifold` computes it (O(n) from the rates,
`chain_stationary`) against the dense GTH of the same generators (`stationary_distribution`,
O(n^3), compiled and vectorised: what it did before), interleaved; the dense sides include
building the matrices, as the old path did. Fewer points at larger n keep them to seconds.

Large dense generators (`--dense-states`, no target): the compiled elimination in panels
(`stationary_kernel._censor_blocked`, used from `BLOCK_MIN` states) against the unblocked one
(`_censor`, what ran before) on one random dense generator, interleaved, medians, with GFLOP/s
at `2 n^3 / 3` operations; the censored matrices they leave agree to rounding (the largest
relative difference is printed), as do the `p` that `stationary_distribution` returns.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import scipy.linalg

import fastslow_sim as fs
import fastslow_sim.stationary as st
from fastslow_sim.stationary_kernel import _DGEMM, BLOCK_MIN, _censor, _censor_blocked


def null_space_loop(Q):
    out = np.empty(Q.shape[:-1])
    for b in range(Q.shape[0]):
        v = scipy.linalg.null_space(Q[b].T)[:, 0]
        out[b] = v / v.sum()
    return out


def vectorised(Q):
    """GTH as `stationary_distribution` ran it before the compiled kernel (`stationary_kernel`):
    the batch-last vectorised elimination, bit for bit the same numbers."""
    saved = dict(st._KERNEL)
    st._KERNEL["gth"] = None
    try:
        return fs.stationary_distribution(Q, "gth")
    finally:
        st._KERNEL.clear()
        st._KERNEL.update(saved)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--states", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chain-states", type=int, nargs="*", default=[64, 256, 1024],
                        help="neighbour-chain sizes for the O(n) table (none: skip it)")  # fmt: skip
    parser.add_argument("--dense-states", type=int, nargs="*", default=[512, 1024, 2048],
                        help="dense-generator sizes for the panel table (none: skip it; 4096 "
                        "takes about 25 s a round)")  # fmt: skip
    args = parser.parse_args()

    Q = fs.random_generators(args.count, args.states, seed=args.seed)
    runners = {
        "gth (batched)": lambda: fs.stationary_distribution(Q, "gth"),
        "gth, vectorised elimination (without the compiled kernel)": lambda: vectorised(Q),
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
        "gth, vectorised elimination (without the compiled kernel)": vectorised(Qbd),
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
    if args.chain_states:
        chain_table(args.chain_states, args.rounds)
    if args.dense_states:
        panel_table(args.dense_states, min(args.rounds, 3))


def chain_table(sizes, rounds):
    """O(n) `p_st` of neighbour chains against the dense GTH, per point, interleaved."""
    print(f"\n## neighbour chains: critical_manifold (O(n)) against dense GTH, {rounds} "
          f"interleaved rounds, medians")  # fmt: skip
    print("| states | points | O(n) ms/point | dense GTH, compiled, ms/point | speed-up | dense "
          "GTH, vectorised, ms/point | compiled over vectorised | max rel. difference O(n) vs "
          "dense (entries > 1e-250) | max rel. error vs closed form (entries > 1e-250) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        system = fs.make_system("birth-death", eps=0.1, states=n)
        gen = system.generator
        points = max(2, min(401, int(4e8 / n**3)))  # the dense side: about 0.5 s per round
        y = np.linspace(-1.0, 2.0, points)[:, None]
        runners = {
            "chain": lambda: system.critical_manifold(y),
            "dense": lambda: fs.stationary_distribution(gen.rates(y)),
            "vectorised": lambda: vectorised(gen.rates(y)),
        }
        for fn in runners.values():  # warm-up, untimed: a compiled kernel's first call loads it
            fn()
        times = {k: [] for k in runners}
        out = {}
        for _ in range(rounds):
            for name, fn in runners.items():
                t0 = time.perf_counter()
                out[name] = fn()
                times[name].append((time.perf_counter() - t0) / points)
        exact = gen.closed_form(y)
        big = exact > 1e-250
        diff = np.max(np.abs(out["chain"] - out["dense"])[big] / out["dense"][big])
        err = np.max(np.abs(out["chain"] - exact)[big] / exact[big])
        # the kernel: the same numbers, to rounding where it eliminates in panels
        same = np.abs(out["dense"] - out["vectorised"])[big] / out["vectorised"][big]
        assert np.max(same, initial=0.0) <= (1e-12 if n >= BLOCK_MIN else 0.0)
        tc, td, tv = (np.median(times[k]) for k in runners)
        print(f"| {n} | {points} | {1e3 * tc:.4f} | {1e3 * td:.2f} | {td / tc:,.0f}x | "
              f"{1e3 * tv:.2f} | {tv / td:.1f}x | {diff:.1e} | {err:.1e} |")  # fmt: skip


def panel_table(sizes, rounds):
    """The elimination of one dense generator in panels against the unblocked one, interleaved."""
    print(f"\n## dense generators: elimination in panels (dgemm) against the unblocked one, "
          f"{rounds} interleaved rounds, medians; GFLOP/s at 2n^3/3")  # fmt: skip
    print("| states | unblocked s | GFLOP/s | in panels s | GFLOP/s | speed-up | max rel. "
          "difference of the censored matrices | stationary_distribution s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        q = fs.random_generators(1, n, seed=n)
        off = q[0].copy()
        np.fill_diagonal(off, 0.0)
        runners = {"unblocked": lambda a: _censor(a), "panels": lambda a: _censor_blocked(a, _DGEMM),
                   "api": lambda a: fs.stationary_distribution(q)}  # fmt: skip
        for fn in runners.values():  # warm-up, untimed: first calls (compiled kernels) off the clock
            fn(off.copy())
        times = {k: [] for k in runners}
        out = {}
        for _ in range(rounds):
            for name, fn in runners.items():
                a = off.copy()
                t0 = time.perf_counter()
                fn(a)
                times[name].append(time.perf_counter() - t0)
                out[name] = a
        upper = np.triu_indices(n)  # what the back-substitution reads
        ref = out["unblocked"][upper]
        diff = np.max(np.abs(out["panels"][upper] - ref) / np.abs(ref).clip(1e-300))
        tu, tp, ta = (float(np.median(times[k])) for k in runners)
        flops = 2 * n**3 / 3
        print(f"| {n} | {tu:.3f} | {flops / tu / 1e9:.1f} | {tp:.3f} | {flops / tp / 1e9:.1f} | "
              f"{tu / tp:.1f}x | {diff:.1e} | {ta:.3f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
