"""How phi_theta's distance to p_st falls with training tokens and with P, for the coupled and
the parameter-matched dense arm (issue 12, item 3).

    python scripts/phi_vs_pst_sweep.py [--out runs/phi-sweep] [--seed 0]

Token sweep: 125k, 500k and 2M tokens on `me:tokens=2400000` (2.16M training tokens, so even
the longest run sees every token less than once). P sweep: P = 4, 8, 16 at 500k tokens on the
default `me` corpus (its block length is P, so each P is its own corpus). Every other setting is
`reproduce`'s default. Runs are resumable: a finished run folder is reused. Prints one table,
saves every result to OUT/phi_vs_pst_sweep.json (the figure reads it). The sweep itself is
`fastslow_sim.gallery.phi_sweep` (which `fastslow-sim figures` calls where the file is missing).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastslow_sim.cli.network import _mean_se
from fastslow_sim.gallery import FULL, phi_sweep, sweep_plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/phi-sweep")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = phi_sweep(Path(args.out), sweep_plan(FULL), seed=args.seed, log=lambda m: print(m, flush=True))
    cols = ("model head", "slow-state probe", "probe on the past blocks' histograms",
            "Bayes filter, head readout", "Bayes filter p_st", "corpus frequencies")  # fmt: skip
    print(
        f"# phi_vs_pst_sweep: mean TV to p_st(y_b) ± s.e. over validation windows, seed {args.seed}"
    )
    print("| sweep | corpus | arm | P | tokens | " + " | ".join(cols) + " |")
    print("|---|---|---|---:|---:|" + "---:|" * len(cols))
    for r in rows:
        cells = [_mean_se(r["tv"][c]) if c in r["tv"] else "-" for c in cols]
        print(f"| {r['sweep']} | {r['corpus']} | {r['arm']} | {r['P']} | {r['tokens']:,} | "
              + " | ".join(cells) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
