"""Benchmark: what `integrate(method="auto")` chooses from eps = 0.5 down to 1e-12, its cost, and
its error on the output grid (issue 13).

Run: python scripts/bench_auto.py [--system birth-death] [--t-end 5] [--rtol 1e-8] [--atol 1e-10]
     [--compare lsoda,radau,rodas4,dop853]

For each eps: the method `auto` chose, its function evaluations and wall time (of a second,
identical call: the first, untimed, loads what the method compiles), and its error on
the 401-point output grid against a reference (rodas4 at rtol 1e-11, atol 1e-13), as
`max |z - z_ref| / (atol + rtol |z_ref|)` (below 1: the requested tolerance is met at the output
times) and as `max |z - z_ref|`. `--compare` adds rows for fixed methods at the requested
tolerances (each row runs twice; beware: radau below eps 1e-7 and explicit methods below 1e-2
take minutes).
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings

import numpy as np
import torch

import fastslow_sim as fs

EPS = (0.5, 0.125, 1e-2, 1e-3, 1e-4, 1e-6, 1e-8, 1e-9, 1e-10, 1e-12)


def stacked(ds):
    return np.concatenate([ds["x"].values, ds["y"].values], axis=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="birth-death", choices=list(fs.SYSTEMS))
    parser.add_argument("--t-end", type=float, default=5.0)
    parser.add_argument("--rtol", type=float, default=1e-8)
    parser.add_argument("--atol", type=float, default=1e-10)
    parser.add_argument("--compare", default="", help="comma-separated fixed methods")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the timed solves (small systems: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = ["auto"] + [m for m in args.compare.split(",") if m]
    print(
        f"# bench_auto: {args.system}, t in [0, {args.t_end:g}], rtol {args.rtol:g}, atol "
        f"{args.atol:g}, 401 output times; reference rodas4 at rtol 1e-11; python "
        f"{platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} "
        f"torch thread(s)"
    )
    print("| eps | requested | method chosen | solver rtol | status | nfev | wall (s) | "
          "error / tolerance | max abs error |")  # fmt: skip
    print("|---:|---|---|---:|---|---:|---:|---:|---:|")
    worst = 0.0
    for eps in EPS:
        system = fs.make_system(args.system, eps=eps)
        ref = stacked(fs.integrate(system, (0, args.t_end), method="rodas4", rtol=1e-11,
                                   atol=1e-13))  # fmt: skip
        for m in methods:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")

                def run(m=m, system=system):
                    return fs.integrate(system, (0, args.t_end), method=m, rtol=args.rtol,
                                        atol=args.atol, threads=args.threads)  # fmt: skip

                run()  # warm-up, untimed: the first call of the method it picks loads its kernels
                start = time.perf_counter()
                ds = run()
                wall = time.perf_counter() - start
            z = stacked(ds)
            err = np.max(np.abs(z - ref) / (args.atol + args.rtol * np.abs(ref)))
            if m == "auto":
                worst = max(worst, err)
            a = ds.attrs
            print(f"| {eps:g} | {m} | {a['method']} | {a['solver_rtol']:.3g} | {a['status']} | "
                  f"{a['nfev']} | {wall:.3f} | {err:.3g} | {np.max(np.abs(z - ref)):.2e} |",
                  flush=True)  # fmt: skip
    print(f"auto: largest error / tolerance {worst:.3g} ({'met' if worst <= 1 else 'NOT met'})")


if __name__ == "__main__":
    main()
