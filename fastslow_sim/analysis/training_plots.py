"""Figures of the training experiments, read from saved run folders (train.nc, ablation.nc,
phi_vs_pst.json); nothing here trains a model. As in `plots`, each function takes optional
Axes (`ax=`) and returns the Figure; `save_figure` writes it to a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .plots import axis_label, figure_axes

ARMS = ("dense", "dense-matched", "coupled", "frozen-gate", "frozen-slow")
COLORS = {"dense": "C0", "dense-matched": "C4", "coupled": "C1", "frozen-gate": "C2",
          "frozen-slow": "C3"}  # fmt: skip


def _runs(ablation_dir):
    """`{variant: [train dataset per seed]}` from a `reproduce` folder."""
    from fastslow_sim.io import load_dataset

    out = {}
    for path in sorted(Path(ablation_dir).glob("*-seed*/train.nc")):
        variant = path.parent.name.rsplit("-seed", 1)[0]
        out.setdefault(variant, []).append(load_dataset(path))
    return out


def plot_gates(ablation_dirs: dict, *, ax=None):
    """|tanh(alpha)| per layer during training, one panel per (corpus, arm), seeds overlaid.

    `ax`: `len(ablation_dirs) x 4` Axes (rows: corpora, columns: arms), or None for a new
    figure. Returns the Figure.
    """
    corpora = list(ablation_dirs)
    fig, axes = figure_axes(ax, len(corpora) * len(ARMS), nrows=len(corpora), ncols=len(ARMS),
                            figsize=(3.6 * len(ARMS), 3.0 * len(corpora)), sharex="row")  # fmt: skip
    for r, corpus in enumerate(corpora):
        runs = _runs(ablation_dirs[corpus])
        for c, arm in enumerate(ARMS):
            ax = axes[r * len(ARMS) + c]
            for seed, ds in enumerate(runs.get(arm, [])):
                for layer in ds["layer"].values:
                    ax.plot(ds["step"].values, ds["gate"].values[:, layer], color=f"C{layer}",
                            lw=1.0, ls=["-", "--", ":"][seed % 3],
                            label=f"layer {layer}" if seed == 0 else None)  # fmt: skip
            ax.set_title(f"{corpus}: {arm}", fontsize=9)
            ax.set_xlabel("step")
            if c == 0:
                ax.set_ylabel(r"$|\tanh\alpha|$")  # the long_name is too long for a panel
            if r == 0 and c == 1:
                ax.legend(fontsize=7)
    fig.suptitle("gates per layer during training (line style: seed)", fontsize=10)
    return fig


def plot_val_loss(ablation_dirs: dict, references: dict | None = None, *, ax=None):
    """Validation loss per arm against training step: mean over seeds, band from min to max.

    `references`: `{corpus: {name: loss}}` drawn as dotted lines. `ax`: one Axes per corpus, or
    None for a new figure. Returns the Figure.
    """
    corpora = list(ablation_dirs)
    fig, axes = figure_axes(ax, len(corpora), nrows=1, ncols=len(corpora),
                            figsize=(6 * len(corpora), 4.2))  # fmt: skip
    for ax, corpus in zip(axes, corpora):
        runs = _runs(ablation_dirs[corpus])
        for arm in ARMS:
            if arm not in runs:
                continue
            steps = runs[arm][0]["eval_step"].values
            v = np.array([ds["val_loss"].values for ds in runs[arm]])
            ax.plot(steps, v.mean(0), color=COLORS[arm], label=f"{arm} ({len(v)} seeds)")
            ax.fill_between(steps, v.min(0), v.max(0), color=COLORS[arm], alpha=0.2)
        for name, value in (references or {}).get(corpus, {}).items():
            ax.axhline(value, color="k", lw=0.8, ls=":")
            ax.text(steps[0], value, f" {name} {value:.3f}", fontsize=7, va="bottom")
        ax.set_xlabel("step")
        first = next(iter(runs.values()), [None])[0]
        default = "validation loss (nats/token)"
        ax.set_ylabel(default if first is None else axis_label(first["val_loss"], default))
        ax.set_title(corpus)
        ax.legend(fontsize=8)
    return fig


def plot_wall_clock(ablation_dirs: dict, *, ax=None):
    """Wall-clock per run for every arm (bars: mean over seeds, dots: seeds).

    `ax`: one Axes per corpus, or None for a new figure. Returns the Figure.
    """
    from fastslow_sim.io import load_dataset

    corpora = list(ablation_dirs)
    fig, axes = figure_axes(ax, len(corpora), nrows=1, ncols=len(corpora),
                            figsize=(5.5 * len(corpora), 3.8))  # fmt: skip
    for ax, corpus in zip(axes, corpora):
        ds = load_dataset(Path(ablation_dirs[corpus]) / "ablation.nc")
        arms = list(ds["arm"].values)
        wall = ds["wall_time_s"].values
        ax.bar(
            range(len(arms)), wall.mean(1), color=[COLORS.get(a, "gray") for a in arms], alpha=0.7
        )
        for i in range(len(arms)):
            ax.plot(np.full(wall.shape[1], i), wall[i], "k.", ms=5)
        ax.set_xticks(range(len(arms)), arms, rotation=15)
        ax.set_ylabel(axis_label(ds["wall_time_s"], "wall-clock per run (s)"))
        ax.set_title(f"{corpus}: {int(ds.attrs['tokens']):,} tokens per run")
    return fig
