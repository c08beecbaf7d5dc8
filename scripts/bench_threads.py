"""Benchmark: torch's intra-op threads on the ODE core's problems and on network training, side by side.

Each case runs with no process of ours competing ("idle": whatever else runs on the machine
still runs) and with one other busy process.

Run: python scripts/bench_threads.py [--rounds 5] [--threads 2] [--cases all]

Cases 1-7 are one `fastslow_sim.integrate` call on the CPU whose work runs in torch operations
(the torch rodas4 march, torchdiffeq; cases 4-6 are above the rule's 2^16 elements); cases 8-11
a short `fastslow_sim.training.train` run (coupled network, me corpus), which keeps torch's
setting unless told (`--threads`).
Each is timed with torch's intra-op threads set to `--threads` (the machine's default) and to 1,
interleaved in rotating order, `--rounds` rounds; the table gives medians and the median of the per-round
ratios. "busy" rounds run while a second process spins on one core, as a user's other job or
a test run would: an OpenMP parallel region then waits for a thread that the scheduler has
put behind that process, and each such wait costs up to a time slice (milliseconds) however
small the tensor. `integrate` decides the threads itself (`threads.small_problem_threads`);
this script overrides that decision, and `train`'s default, through their `threads` option to
measure both settings.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

import fastslow_sim as fs

# name: (system, system options, method, integrate options, batch, t_end)
CASES = {
    "random-64, 1 trajectory, rodas4 (torch march, dense LU)":
        ("random", {"states": 64}, "rodas4", {}, 1, 0.5),
    "birth-death 8, 1 trajectory, rodas4 --march torch":
        ("birth-death", {}, "rodas4", {"march": "torch"}, 1, 10.0),
    "birth-death 16, 1,024 trajectories, rodas4 --march torch":
        ("birth-death", {"states": 16}, "rodas4", {"march": "torch"}, 1024, 2.0),
    "random-64, 64 trajectories, rodas4 (torch march, dense LU)":
        ("random", {"states": 64}, "rodas4", {}, 64, 0.1),
    "birth-death 32, 4,096 trajectories, rodas4 --march torch":
        ("birth-death", {"states": 32}, "rodas4", {"march": "torch"}, 4096, 0.2),
    "birth-death 64, 16,384 trajectories, rodas4 --march torch":
        ("birth-death", {"states": 64}, "rodas4", {"march": "torch"}, 16384, 0.001),
    "two-state, 1 trajectory, dopri5 (torchdiffeq)":
        ("two-state", {}, "dopri5", {}, 1, 10.0),
    # training runs (`fastslow_sim.training.train`, coupled variant, me corpus of 60k tokens):
    # ("train", TrainConfig fields, steps); step_elements = batch x context x 4 n_embd
    "network, tiny-gate example (batch 8, context 64, n_embd 32, 2 layers; 65,536), 16 steps":
        ("train", {"batch_size": 8, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32},
         16),
    "network, batch 2, context 64, n_embd 128, 4 layers (65,536), 16 steps":
        ("train", {"batch_size": 2, "block_size": 64}, 16),
    "network, batch 8, context 64, n_embd 128, 4 layers (262,144), 8 steps":
        ("train", {"batch_size": 8, "block_size": 64}, 8),
    "network, reproduce defaults (batch 8, context 256, n_embd 128, 4 layers; 1,048,576), 4 steps":
        ("train", {"batch_size": 8, "block_size": 256}, 4),
}
TRAIN_CORPUS = "me:tokens=60000"


@functools.lru_cache
def train_corpus(context: int):
    """The cases' corpus, made once per context (about 4 s), outside the timed runs."""
    from fastslow_sim.corpora import load_corpus

    return load_corpus(TRAIN_CORPUS, P=8, context=context)


def run_training(fields, steps, threads):
    """One short training run on `threads` torch threads; `(wall, status, losses per step)`."""
    import tempfile

    from fastslow_sim.io import load_dataset
    from fastslow_sim.training import TrainConfig, train

    corpus = train_corpus(fields["block_size"])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(corpus=TRAIN_CORPUS, seed=0, out=f"{tmp}/run", progress=False,
                          tokens=steps * fields["batch_size"] * fields["block_size"],
                          eval_interval=10**6, eval_batches=1, warmup_steps=2, threads=threads,
                          **fields)  # fmt: skip
        start = time.perf_counter()
        summary = train(cfg, corpus, log=lambda *a: None)
        wall = time.perf_counter() - start
        losses = load_dataset(f"{cfg.out}/train.nc")["loss"].values
    return wall, f"{summary['steps']} steps", losses


def run_case(case, threads):
    if case[0] == "train":
        return run_training(case[1], case[2], threads)
    name, sys_opts, method, opts, batch, t_end = case
    system = fs.make_system(name, eps=1e-4 if method != "dopri5" else 0.1, **sys_opts)
    x0 = y0 = None
    if batch > 1:
        x0, y0 = fs.random_initial_conditions(system, batch, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        ds = fs.integrate(system, (0, t_end), x0, y0, method=method, rtol=1e-6, atol=1e-9,
                          n_eval=3, threads=threads, **opts)  # fmt: skip
        wall = time.perf_counter() - start
    status = ds.attrs["status"]
    return wall, status, np.concatenate([ds["x"].values, ds["y"].values], axis=-1)


def spinner():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=max(2, torch.get_num_threads()),
                        help="the many-thread setting compared with 1 (default: torch's)")
    parser.add_argument("--cases", default="all", help="comma-separated case numbers (1-based)")
    args = parser.parse_args()
    if args.rounds < 1 or args.threads < 2:
        parser.error(f"--rounds must be >= 1 and --threads >= 2; got {args.rounds}, {args.threads}.")
    keys = list(CASES)
    if args.cases != "all":
        try:
            picked = [int(i) for i in args.cases.split(",")]
            if not all(1 <= i <= len(CASES) for i in picked):
                raise ValueError(args.cases)
            keys = [keys[i - 1] for i in picked]
        except ValueError:
            parser.error(f"--cases takes numbers from 1 to {len(CASES)}; got {args.cases!r}.")
    print(f"# bench_threads: python {platform.python_version()}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {args.rounds} interleaved rounds, medians")  # fmt: skip
    print(f"| case | load | {args.threads} threads s | 1 thread s | {args.threads} threads / 1 "
          f"(median of rounds) | same result |")  # fmt: skip
    print("|---|---|---:|---:|---:|---|")
    for key in keys:
        case = CASES[key]
        run_case(case, 1)  # warm-up: imports, numba, first-call costs
        for load in ("idle", "1 busy process"):
            proc = spinner() if load != "idle" else None
            try:
                time.sleep(0.2 if proc else 0.0)
                times = {args.threads: [], 1: []}
                results = {}
                for r in range(args.rounds):
                    order = (args.threads, 1) if r % 2 == 0 else (1, args.threads)
                    for th in order:
                        wall, status, z = run_case(case, th)
                        times[th].append(wall)
                        results[th] = (status, z)
            finally:
                if proc:
                    proc.kill()
                    proc.wait()
            ratios = [a / b for a, b in zip(times[args.threads], times[1])]
            same = np.array_equal(results[1][1], results[args.threads][1])
            agree = "bit for bit" if same else (
                f"max diff {np.nanmax(np.abs(results[1][1] - results[args.threads][1])):.1e}")
            print(f"| {key} | {load} | {statistics.median(times[args.threads]):.3f} | "
                  f"{statistics.median(times[1]):.3f} | {statistics.median(ratios):.2f}x | "
                  f"{agree} ({results[1][0]}) |")  # fmt: skip


if __name__ == "__main__":
    main()
