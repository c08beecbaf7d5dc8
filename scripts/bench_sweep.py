"""Benchmark: the sweep engine (issue 17), one process against a local cluster of 2 workers.

Run: python scripts/bench_sweep.py [--rounds 3] [--t-end 2] [--tokens 4096] [--seeds 2]
     [--no-reproduce]

Workloads:
- a 64-cell `integrate` sweep (eps = 0.1, 0.05, 0.02, 0.01 x seed = 0..15, birth-death): in
  one process (`workers=0`, the batch as one chunk of 64 cells, one rodas4 call) and on 2
  workers (the default chunking, `ceil(64 / 2 workers)`: 2 chunks of 32, one per worker, each
  one call across its eps; and with `chunk_size=8`: 8 chunks of 8);
- the `reproduce` grid (5 arms x SEEDS seeds on a small me corpus, a tiny model and a small
  token budget `--tokens`), in one process and on 2 workers.

Each round runs every configuration once, interleaved, into a fresh store; the clusters are
started (and warmed by one small sweep, which loads the compiled kernels and the corpus) before
the timed rounds, and their start-up is reported apart. Medians over the rounds; ratio = one
process / 2 workers (above 1: the cluster is faster).

Overhead per task of the engine: 16 short cells (eps x seed = 0..3, t_end 0.1) run one per
task (`chunk_size=1`), against the task function called on each cell directly (the same
`integrate` call, no engine): `(engine - direct) / 16`, in this process (cell file, store) and
on 1 dask worker (plus submission, scheduling, transfer).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import dask  # noqa: E402
import torch  # noqa: E402
from distributed import Client  # noqa: E402

from fastslow_sim.sweep import (  # noqa: E402
    _local_cluster,
    get_task,
    make_cells,
    parse_grid,
    parse_options,
    run_sweep,
)
from fastslow_sim.training import ARMS, reproduce  # noqa: E402

EPS = "0.1,0.05,0.02,0.01"
TINY = dict(block_size=32, batch_size=4, n_layer=1, n_head=2, n_embd=32, P=4, eval_interval=8,
            eval_batches=2, ckpt_interval=1000, warmup_steps=2, device="cpu", progress=False)  # fmt: skip
CORPUS = "me:tokens=60000"


def quiet(*a):
    pass


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--t-end", default="2")
    parser.add_argument("--n-eval", default="21")
    parser.add_argument("--tokens", type=int, default=4096, help="training tokens per reproduce run")
    parser.add_argument("--seeds", type=int, default=2, help="seeds of the reproduce grid")
    parser.add_argument("--no-reproduce", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    opts = {"t_end": args.t_end, "n_eval": args.n_eval, "eps": "0.1"}
    grid = [f"eps={EPS}", "seed=0:15"]
    root = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    n = [0]

    def fresh(name):
        n[0] += 1
        return root / f"{name}-{n[0]}"

    small = [f"eps={EPS}", "seed=0:3"]

    short = {**opts, "t_end": "0.1"}
    cells = make_cells(get_task("integrate"), parse_grid("integrate", small),
                       parse_options("integrate", short))  # fmt: skip

    def direct():
        for _, _, params in cells:
            get_task("integrate").run([params])

    print(f"# bench_sweep: python {platform.python_version()}, torch {torch.__version__}, dask "
          f"{dask.__version__}, {os.cpu_count()} cores, OMP threads {os.environ['OMP_NUM_THREADS']}"
          f", {args.rounds} rounds (medians)")  # fmt: skip
    t0 = time.perf_counter()
    k1 = _local_cluster(1, threads=1)
    c1 = Client(k1)
    start1 = time.perf_counter() - t0
    t0 = time.perf_counter()
    k2 = _local_cluster(2, threads=max(1, (os.cpu_count() or 2) // 2))
    c2 = Client(k2)
    start2 = time.perf_counter() - t0
    try:
        for c in (c1, c2):  # warm: compiled kernels loaded, corpus built, in every process
            run_sweep("integrate", ["seed=0:3"], opts, fresh("warm"), client=c, chunk_size=1,
                      progress=False, log=quiet)  # fmt: skip
        run_sweep("integrate", ["seed=0:3"], opts, fresh("warm"), workers=0, progress=False,
                  log=quiet)  # fmt: skip
        if not args.no_reproduce:
            for kw in ({"workers": 0}, {"client": c2}):
                reproduce(CORPUS, 256, 1, list(ARMS), str(fresh("warm-rep")), TINY, log=quiet,
                          **kw)  # fmt: skip
        times: dict[str, list[float]] = {}
        configs = {
            "integrate 1 process": lambda: run_sweep("integrate", grid, opts, fresh("i"),
                                                     workers=0, progress=False, log=quiet),
            "integrate 2 workers": lambda: run_sweep("integrate", grid, opts, fresh("i"),
                                                     client=c2, progress=False, log=quiet),
            "integrate 2 workers, chunk 8": lambda: run_sweep("integrate", grid, opts,
                                                              fresh("i"), client=c2,
                                                              chunk_size=8, progress=False,
                                                              log=quiet),
            "direct 16 cells": direct,
            "engine per cell, 1 process": lambda: run_sweep("integrate", small, short, fresh("o"),
                                                            workers=0, chunk_size=1,
                                                            progress=False, log=quiet),
            "engine per cell, 1 dask worker": lambda: run_sweep("integrate", small, short,
                                                                fresh("o"), client=c1,
                                                                chunk_size=1, progress=False,
                                                                log=quiet),
        }  # fmt: skip
        if not args.no_reproduce:
            configs["reproduce 1 process"] = lambda: reproduce(
                CORPUS, args.tokens, args.seeds, list(ARMS), str(fresh("r")), TINY, log=quiet)
            configs["reproduce 2 workers"] = lambda: reproduce(
                CORPUS, args.tokens, args.seeds, list(ARMS), str(fresh("r")), TINY, log=quiet,
                client=c2)
        for r in range(args.rounds):
            for name, fn in configs.items():
                times.setdefault(name, []).append(timed(fn))
            print(f"# round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                  flush=True)  # fmt: skip
    finally:
        for x in (c1, c2, k1, k2):
            x.close()
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print()
    print("| workload | cells | one process (s) | 2 workers (s) | ratio one / two |")
    print("|---|---:|---:|---:|---:|")
    rows = [("integrate sweep (eps x seed; 1 process: one rodas4 batch of 64; 2 workers: 2 "
             "batches of 32)", 64, "integrate 1 process", "integrate 2 workers"),
            ("integrate sweep, 2 workers with 8 batches of 8", 64, "integrate 1 process",
             "integrate 2 workers, chunk 8")]  # fmt: skip
    if not args.no_reproduce:
        rows.append((f"reproduce grid ({len(ARMS)} arms x {args.seeds} seeds, {args.tokens:,} "
                     f"tokens)", len(ARMS) * args.seeds, "reproduce 1 process",
                     "reproduce 2 workers"))  # fmt: skip
    for label, cells, one, two in rows:
        a, b = med[one], med[two]
        print(f"| {label} | {cells} | {a:.2f} | {b:.2f} | {a / b:.2f} |")
    d = med["direct 16 cells"]
    print()
    print("| engine overhead per task (16 cells, one cell per task) | ms per cell |")
    print("|---|---:|")
    print(f"| the task function called directly, per cell (no engine) | {1e3 * d / 16:.1f} |")
    print(f"| in this process: cell file + store, (engine - direct) / 16 | "
          f"{1e3 * (med['engine per cell, 1 process'] - d) / 16:.1f} |")  # fmt: skip
    print(f"| on 1 dask worker: + submit, schedule, transfer, (engine - direct) / 16 | "
          f"{1e3 * (med['engine per cell, 1 dask worker'] - d) / 16:.1f} |")  # fmt: skip
    print(f"\ncluster start-up: 1 worker {start1:.1f} s, 2 workers {start2:.1f} s (not in the "
          f"times above; a first sweep on fresh workers also loads the compiled kernels)")  # fmt: skip


if __name__ == "__main__":
    main()
