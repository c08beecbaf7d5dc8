"""Paired per-seed differences between arms of two `reproduce` folders: a control that needs its
own token budget, such as dense trained for the coupled arm's FLOPs.

    python scripts/paired_runs.py A_DIR ARM_A B_DIR ARM_B [--margin 0.01]

Reads `A_DIR/ablation.nc` and `B_DIR/ablation.nc` (written by `fastslow-sim reproduce`), pairs
the runs by seed (the runs of one seed share the dense initialisation and the order of the
batches; the longer run sees more of them) and prints `ARM_A - ARM_B` of the validation loss
over the seeds both hold, with the t interval (df = seeds - 1) and the verdict of
`fastslow_sim.training.paired_comparison`, beside each arm's tokens, FLOPs per token and
training FLOPs per run. Both folders must be on the same corpus (the same tokens: `me` at P = 8
is `me:block=8` at any P), with the same P, context and batch size, and share a seed; otherwise
the pairing is refused. `--across-P` pairs runs of different P on one corpus (a grid control:
the same data order and initial weights, only the pooling differs); runs of one P whose pooling
grids start at other tokens (`--pool-offset`) pair as they are, the offset shown beside P.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    import fastslow_sim as fs
    from fastslow_sim.training import paired_comparison

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a_dir"), parser.add_argument("arm_a")
    parser.add_argument("b_dir"), parser.add_argument("arm_b")
    parser.add_argument("--margin", type=float, default=0.01,
                        help="equivalence margin in nats/token [default: 0.01]")  # fmt: skip
    parser.add_argument("--across-P", action="store_true",
                        help="pair runs whose model P differs (one corpus, one data order)")  # fmt: skip
    args = parser.parse_args(argv)
    sides = []
    for folder, arm in ((args.a_dir, args.arm_a), (args.b_dir, args.arm_b)):
        path = Path(folder) / "ablation.nc"
        if not path.is_file():
            print(f"no ablation.nc in {folder}; expected a folder written by `fastslow-sim "
                  f"reproduce`.", file=sys.stderr)  # fmt: skip
            return 2
        ds = fs.load_dataset(path)
        if arm not in ds["arm"].values.tolist():
            print(f"arm {arm!r} is not in {path}; it holds {ds['arm'].values.tolist()}.",
                  file=sys.stderr)  # fmt: skip
            return 2
        sides.append((ds, ds.sel(arm=arm)))
    (da, a), (db, b) = sides
    import json

    configs = [json.loads(d.attrs.get("base_config", "{}")) for d in (da, db)]
    try:
        same = _corpus(da.attrs["corpus"], configs[0]) == _corpus(db.attrs["corpus"], configs[1])
    except fs.InputError as err:  # a spec this version refuses (an older folder's)
        print(f"a folder's corpus cannot be read: {err}", file=sys.stderr)
        return 2
    if not same:
        Ps = [c.get("P") for c in configs]
        at = (f" at P={Ps[0]} and P={Ps[1]}: an me corpus's blocks are the model's P unless "
              f"its spec sets block=N" if da.attrs["corpus"] == db.attrs["corpus"] else "")
        print(f"the folders hold different corpora ({da.attrs['corpus']} and "
              f"{db.attrs['corpus']}{at}); expected one.", file=sys.stderr)  # fmt: skip
        return 2
    for key in ("block_size", "batch_size") + (() if args.across_P else ("P",)):
        # the pairing holds the model's setting fixed (P too, unless --across-P)
        values = [c.get(key) for c in configs]
        if None not in values and values[0] != values[1]:
            print(f"the folders were trained with different {key} ({values[0]} and "
                  f"{values[1]}); expected one.", file=sys.stderr)  # fmt: skip
            return 2
    seeds = sorted(set(a["seed"].values.tolist()) & set(b["seed"].values.tolist()))
    if not seeds:
        print(f"the folders share no seed ({a['seed'].values.tolist()} and "
              f"{b['seed'].values.tolist()}); expected runs paired by seed.", file=sys.stderr)  # fmt: skip
        return 2
    va = a["val_loss"].sel(seed=seeds).values
    vb = b["val_loss"].sel(seed=seeds).values
    if not (np.isfinite(va).all() and np.isfinite(vb).all()):
        print("a run has no finite validation loss; expected every paired run finished.",
              file=sys.stderr)  # fmt: skip
        return 2
    print(f"corpus {da.attrs['corpus']}" + ("" if db.attrs["corpus"] == da.attrs["corpus"] else
          f" (and {db.attrs['corpus']}, the same tokens)") + f"; seeds {seeds}")  # fmt: skip
    print("| arm | folder | P | tokens per run | FLOPs/token | training FLOPs per run | val loss, "
          "mean ± sd |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|")
    for arm, side, folder, v, cfg in ((args.arm_a, a, args.a_dir, va, configs[0]),
                                      (args.arm_b, b, args.b_dir, vb, configs[1])):  # fmt: skip
        tokens = int(side["tokens"].sel(seed=seeds).values.max())
        fpt = float(side["flops_per_token"])
        grid = f" (offset {cfg['pool_offset']})" if cfg.get("pool_offset") else ""
        print(f"| {arm} | {folder} | {cfg.get('P', '?')}{grid} | {tokens:,} | {fpt / 1e6:.2f} M | "
              f"{fpt * tokens:.3e} | {v.mean():.4f} ± "
              f"{v.std(ddof=1) if len(v) > 1 else float('nan'):.4f} |")  # fmt: skip
    c = paired_comparison(va, vb, margin=args.margin)
    lo, hi = c["ci95"]
    print(f"{args.arm_a} - {args.arm_b}: {c['mean_diff']:+.4f}, 95% t interval [{lo:+.4f}, "
          f"{hi:+.4f}] (df {c['df']}), margin ±{args.margin}: {c['verdict']}"
          + (" (excludes 0)" if c["verdict"] == "equivalent" and c["excludes_zero"] else ""))  # fmt: skip
    print("per seed (a - b): " + ", ".join(f"{d:+.4f}" for d in va - vb))
    return 0


def _corpus(spec: str, config: dict):
    """What makes a folder's tokens: an me spec's full configuration at the folder's P and
    context (`me` at P = 8 and `me:block=8` at P = 7 are one corpus), else the spec."""
    from fastslow_sim.me_corpus import parse_me_spec

    if config.get("P") is None or config.get("block_size") is None:
        return spec
    return parse_me_spec(spec, P=config["P"], context=config["block_size"]) or spec


if __name__ == "__main__":
    sys.exit(main())
