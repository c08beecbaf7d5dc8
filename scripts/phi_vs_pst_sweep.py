"""How phi_theta's distance to p_st falls with training tokens and with P, for the coupled and
the parameter-matched dense arm (issue 12, item 3).

    python scripts/phi_vs_pst_sweep.py [--out runs/phi-sweep] [--seed 0]

Token sweep: 125k, 500k and 2M tokens on `me:tokens=2400000` (2.16M training tokens, so even
the longest run sees every token less than once). P sweep: P = 4, 8, 16 at 500k tokens on the
default `me` corpus (its block length is P, so each P is its own corpus). Every other setting is
`reproduce`'s default. Runs are resumable: a finished run folder is reused. Prints one table,
saves every result to OUT/phi_vs_pst_sweep.json (the figure reads it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastslow_sim.probe import phi_vs_pst
from fastslow_sim.training import TrainConfig, arm_config, train

ARMS = ("coupled", "dense-matched")
TOKEN_CORPUS = "me:tokens=2400000"


def _run(out: Path, corpus: str, arm: str, tokens: int, P: int, seed: int) -> Path:
    from fastslow_sim.corpora import load_corpus

    folder = out / f"{arm}-{'tok' if corpus != 'me' else 'P'}{P}-{tokens}-seed{seed}"
    summary = folder / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("finished"):
        return folder
    base = {"P": P, "progress": False}
    c = load_corpus(corpus, P=P)
    cfg = TrainConfig(corpus=corpus, tokens=tokens, seed=seed, out=str(folder),
                      **arm_config(arm, base, c.vocab_size))  # fmt: skip
    s = train(cfg, c)
    print(
        f"  trained {folder.name}: val {s['val_loss']:.4f} in {s['wall_time_s']:.0f} s", flush=True
    )
    return folder


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/phi-sweep")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    plan = [
        ("tokens", TOKEN_CORPUS, arm, tok, 8)
        for tok in (125_000, 500_000, 2_000_000)
        for arm in ARMS
    ]
    plan += [("P", "me", arm, 500_000, P) for P in (4, 8, 16) for arm in ARMS]
    rows = []
    for sweep, corpus, arm, tokens, P in plan:
        folder = _run(out, corpus, arm, tokens, P, args.seed)
        r = phi_vs_pst(folder)
        rows.append({"sweep": sweep, **{k: v for k, v in r.items() if k != "binned"}})
    (out / "phi_vs_pst_sweep.json").write_text(json.dumps(rows, indent=1))
    cols = ("model head", "slow-state probe", "Bayes filter, head readout", "Bayes filter p_st",
            "corpus frequencies")  # fmt: skip
    print(
        f"# phi_vs_pst_sweep: mean TV to p_st(y_b) ± s.e. over validation windows, seed {args.seed}"
    )
    print("| sweep | corpus | arm | P | tokens | " + " | ".join(cols) + " |")
    print("|---|---|---|---:|---:|" + "---:|" * len(cols))
    for r in rows:
        cells = [f"{r['tv'][c]['mean']:.4f} ± {r['tv'][c]['se']:.4f}" if c in r["tv"] else "-"
                 for c in cols]  # fmt: skip
        print(f"| {r['sweep']} | {r['corpus']} | {r['arm']} | {r['P']} | {r['tokens']:,} | "
              + " | ".join(cells) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
