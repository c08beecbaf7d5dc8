"""Figures of the training experiments, read from saved run folders (train.nc, ablation.nc,
phi_vs_pst.json); nothing here trains a model. As in `plots`, each function takes optional
Axes (`ax=`) and returns the Figure; `save_figure` writes it to a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fastslow_sim.bridge.variants import ARMS

from ..wording import plural
from .palette import ARM_COLORS, WIDTH, arm_color
from .plots import axis_label, figure_axes, refuse_empty

COLORS = ARM_COLORS  # the palette's, kept under the old name
GATED = ("coupled", "frozen-slow", "frozen-gate")  # the arms that have a gate


def _runs(ablation_dir):
    """`{arm: [train dataset per seed]}` of the runs that the `reproduce` folder's ablation.nc
    lists (its arms and seeds, from their folders `ARM-seedS`), no other: a folder also holds
    the runs of earlier ablations (more seeds, other arms), which its ablation did not use. A
    listed run whose train.nc is gone is left out, an arm with none too (the legends count the
    seeds drawn). Each arm's runs are keyed by their position on ablation.nc's seed axis."""
    from fastslow_sim.io import load_dataset

    ablation = load_dataset(Path(ablation_dir) / "ablation.nc")
    paths = {str(arm): [Path(ablation_dir) / f"{arm}-seed{int(seed)}" / "train.nc"
                        for seed in ablation["seed"].values]
             for arm in ablation["arm"].values}  # fmt: skip
    return {arm: {k: load_dataset(p) for k, p in enumerate(ps) if p.is_file()}
            for arm, ps in paths.items() if any(p.is_file() for p in ps)}  # fmt: skip


def _corpora(ablation_dirs: dict) -> list:
    """The corpora of `{corpus: reproduce folder}`, refused in one sentence where there is none."""
    refuse_empty(ablation_dirs, "ablation_dirs", "no corpus to draw",
                 "{corpus: reproduce folder} with at least one corpus")
    return list(ablation_dirs)


def _shared(steps):
    """The steps that every seed's run logged (sorted), and whether the runs logged the same
    ones: runs of one arm may differ in length (one stopped early, or trained on another
    budget), and a mean across seeds is only defined where all of them have a value."""
    common = steps[0]
    for s in steps[1:]:
        common = np.intersect1d(common, s)
    same = all(len(s) == len(steps[0]) and np.array_equal(s, steps[0]) for s in steps)
    return np.asarray(common), same


def _on(steps, values, common):
    """`values` (first axis: `steps`) at the steps `common`, which all lie in `steps`."""
    return values[np.searchsorted(steps, common)] if len(common) else values[:0]


def _plot_seeds(ax, seeds, color, label, hidden: tuple, mean_kw: dict, band_kw: dict) -> None:
    """One curve over an arm's seeds `[(steps, values)]`: the mean and min-max band over the
    steps every seed logged; where the runs logged other steps (one stopped early, or trained
    on another budget), every seed drawn whole and thin too. `label` goes on the mean (on seed
    0's line where the seeds share no step); `hidden`: `(arm, suffix)` of the seed lines'
    legend-less labels, `_ARM run K SUFFIX`."""
    steps, same = _shared([s for s, _ in seeds])
    v = np.array([_on(s, y, steps) for s, y in seeds])  # (seeds, shared steps)
    if not same:
        for k, (s, y) in enumerate(seeds):
            ax.plot(s, y, color=color, lw=0.7, alpha=0.6, marker=_marker(s), ms=3,
                    label=label if label and k == 0 and not len(steps) else f"_{hidden[0]} run {k}{hidden[1]}")  # fmt: skip
    if len(steps):
        ax.plot(steps, v.mean(0), color=color, marker=_marker(steps), ms=4, label=label,
                **mean_kw)  # fmt: skip
        ax.fill_between(steps, v.min(0), v.max(0), color=color, **band_kw)


def _marker(x):
    """A marker where a curve has one point (a run evaluated once draws no line), else none."""
    return "o" if len(x) == 1 else None


def _layer_shades(color, n):
    """`n` shades of `color`, light (layer 0) to dark (last layer)."""
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(color))
    white = np.ones(3)
    # layer 0: halfway to white; the last layer: the colour darkened by a quarter
    mix = np.linspace(0.5, -0.25, n)
    return [tuple(np.clip(rgb + m * (white - rgb) if m >= 0 else rgb * (1 + m), 0, 1))
            for m in mix]  # fmt: skip


def plot_gates(ablation_dirs: dict, *, ax=None):
    """|tanh(alpha)| per layer during training, one panel per corpus: for each gated arm
    (coupled, frozen-slow, frozen-gate) the mean over seeds per layer (shade: layer, light to
    dark) with the seeds' min-max band. The dense arms have no gate.

    `ax`: one Axes per corpus, or None for a new figure. Returns the Figure.
    """
    corpora = _corpora(ablation_dirs)
    fig, axes = figure_axes(ax, len(corpora), nrows=1, ncols=len(corpora),
                            figsize=(WIDTH * min(1.0, 0.5 * len(corpora) + 0.1), 3.9))  # fmt: skip
    for ax, corpus in zip(axes, corpora):
        runs = _runs(ablation_dirs[corpus])
        for arm in GATED:
            if arm not in runs:
                continue
            # each seed on its own steps: the runs of an arm may differ in length
            seeds = [(ds["step"].values, ds["gate"].values)
                     for ds in runs[arm].values()]  # (steps, layers)  # fmt: skip
            n_layers = seeds[0][1].shape[1]
            shades = _layer_shades(arm_color(arm), n_layers)
            label = f"{arm} ({plural(len(seeds), 'seed')})"
            for layer in range(n_layers):
                _plot_seeds(ax, [(s, v[:, layer]) for s, v in seeds], shades[layer],
                            label if layer == n_layers - 1 else None, (arm, f", layer {layer}"),
                            {"lw": 1.3}, {"alpha": 0.06, "lw": 0})  # fmt: skip
        ax.set_title(f"{corpus}: gates per layer (darker: deeper)")
        ax.set_xlabel("training step")
        ax.set_ylabel(r"$|\tanh\alpha|$ (mean over seeds)")
        ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def plot_val_loss(ablation_dirs: dict, references: dict | None = None, *, ax=None):
    """Validation loss per arm against training step: mean over seeds, band from min to max.

    The curves are the losses logged during training, on a few sampled validation batches; the
    final loss on every aligned validation window (ablation.nc's, the table's, on the targets of
    the references) is drawn at the step where the runs ended as a hollow diamond, mean over
    the seeds that ended there (one diamond per end step where the seeds' runs differ).
    `references`: `{corpus: {name: loss}}` drawn as dotted lines. `ax`: one Axes per corpus, or
    None for a new figure. Returns the Figure.
    """
    from fastslow_sim.io import load_dataset

    corpora = _corpora(ablation_dirs)
    fig, axes = figure_axes(ax, len(corpora), nrows=1, ncols=len(corpora),
                            figsize=(WIDTH * min(1.0, 0.5 * len(corpora) + 0.1), 4.0))  # fmt: skip
    for ax, corpus in zip(axes, corpora):
        runs = _runs(ablation_dirs[corpus])
        ablation = load_dataset(Path(ablation_dirs[corpus]) / "ablation.nc")
        first_step = np.inf  # where the references' labels start
        for arm in ARMS:
            if arm not in runs:
                continue
            # each seed on its own steps: the runs of an arm may differ in length
            seeds = [(ds["eval_step"].values, ds["val_loss"].values) for ds in runs[arm].values()]
            _plot_seeds(ax, seeds, arm_color(arm), f"{arm} ({plural(len(seeds), 'seed')})",
                        (arm, ""), {}, {"alpha": 0.2})  # fmt: skip
            full = ablation["val_loss"].sel(arm=arm).values  # (seed,), NaN for a failed run
            # the seeds drawn, each final at its own end step; a failed run's (NaN) left out
            ends: dict = {}
            for k, (s, _) in zip(runs[arm], seeds):
                if len(s) and np.isfinite(full[k]):
                    ends.setdefault(s[-1], []).append(full[k])
            for end, finals in sorted(ends.items()):  # one diamond per end step
                ax.plot(end, np.mean(finals), ls="", marker="D", mfc="none", ms=7,
                        color=arm_color(arm))  # fmt: skip
            first_step = min([first_step] + [s[0] for s, _ in seeds if len(s)])
        ax.plot([], [], ls="", marker="D", mfc="none", color="k",
                label="final, on every validation window")  # fmt: skip
        refs = sorted((references or {}).get(corpus, {}).items(), key=lambda kv: kv[1])
        for k, (name, value) in enumerate(refs):
            ax.axhline(value, color="k", lw=0.8, ls=":")
            # the lowest label below its line, the others above, so that close lines stay legible
            ax.text(first_step if np.isfinite(first_step) else 0, value, f" {name} {value:.3f}",
                    fontsize=7.5,
                    va="top" if k == 0 and len(refs) > 1 else "bottom", ha="left")  # fmt: skip
        ax.set_xlabel("training step")
        first = next((ds for by_seed in runs.values() for ds in by_seed.values()), None)
        default = "validation loss on sampled batches (nats/token)"
        ax.set_ylabel(default if first is None else axis_label(first["val_loss"], default))
        ax.set_title(corpus)
        ax.legend(loc="best")
    fig.tight_layout()
    return fig


def plot_wall_clock(ablation_dirs: dict, *, ax=None):
    """Wall-clock per run for every arm (bars: mean over the seeds with a finite time, counted
    under the arm where some have none; dots: seeds).

    `ax`: one Axes per corpus, or None for a new figure. Returns the Figure.
    """
    from fastslow_sim.io import load_dataset

    corpora = _corpora(ablation_dirs)
    fig, axes = figure_axes(ax, len(corpora), nrows=1, ncols=len(corpora),
                            figsize=(WIDTH * min(1.0, 0.5 * len(corpora) + 0.1), 3.8))  # fmt: skip
    for ax, corpus in zip(axes, corpora):
        ds = load_dataset(Path(ablation_dirs[corpus]) / "ablation.nc")
        arms = list(ds["arm"].values)
        wall = ds["wall_time_s"].values
        # a failed run's time is NaN: the bar is the mean of the finite seeds, counted below it
        ok = np.isfinite(wall)
        mean = np.array([w[k].mean() if k.any() else np.nan for w, k in zip(wall, ok)])
        ax.bar(range(len(arms)), np.nan_to_num(mean), color=[arm_color(a) for a in arms],
               alpha=0.7)  # fmt: skip
        for i in range(len(arms)):
            ax.plot(np.full(wall.shape[1], i), wall[i], "k.", ms=5)
        names = [arm if k.all() else f"{arm}\n({int(k.sum())} of {k.size} seeds)" if k.any()
                 else f"{arm}\n(failed: no finite time)" for arm, k in zip(arms, ok)]  # fmt: skip
        ax.set_xticks(range(len(arms)), names, rotation=20)
        ax.set_ylabel(axis_label(ds["wall_time_s"], "wall-clock per run (s)"))
        tokens = np.atleast_1d(ds.attrs["tokens"])  # trained; several where the runs disagree
        ax.set_title(f"{corpus}: {' or '.join(f'{int(t):,}' for t in tokens)} tokens per run")
    fig.tight_layout()
    return fig


def plot_ablation(ablations: dict, *, ax=None):
    """Paired differences of the validation loss, `a - b` per seed (dots) with their mean and
    t-based 95% interval (bar), one row per comparison and one panel per corpus; the margin
    of equivalence shaded, zero dotted. Colour: the arm `a`.

    `ablations`: `{corpus: ablation dataset}` (`reproduce`'s ablation.nc: `val_loss(arm, seed)`
    and the table in `attrs["table"]`). `ax`: one Axes per corpus, or None. Returns the Figure.
    """
    import json

    refuse_empty(ablations, "ablations", "no corpus to draw",
                 "{corpus: ablation dataset} with at least one corpus")
    corpora = list(ablations)
    fig, axes = figure_axes(ax, len(corpora), nrows=1, ncols=len(corpora),
                            figsize=(WIDTH * min(1.0, 0.5 * len(corpora) + 0.1), 3.9))  # fmt: skip
    for ax, corpus in zip(axes, corpora):
        ds = ablations[corpus]
        table = json.loads(ds.attrs["table"])
        margin = float(table["margin"])
        comps = table["comparisons"]
        arms = list(ds["arm"].values)
        for row, c in enumerate(comps):
            d = ds["val_loss"].values[arms.index(c["a"])] - ds["val_loss"].values[arms.index(c["b"])]
            color = arm_color(c["a"])
            lo, hi = c["ci95"]
            ax.plot([lo, hi], [row, row], color=color, lw=3, solid_capstyle="butt")
            ax.plot(c["mean_diff"], row, "o", color=color, ms=7, mec="k", mew=0.6)
            ax.plot(d, np.full(len(d), row + 0.22), "|", color=color, ms=6, alpha=0.8)
        ax.axvspan(-margin, margin, color="0.85", zorder=0, label=f"margin ±{margin:g}")
        ax.axvline(0, color="k", lw=0.8, ls=":")
        ax.set_yticks(range(len(comps)), [f"{c['a']} − {c['b']}" for c in comps])
        ax.set_ylim(len(comps) - 0.4, -0.6)
        ax.set_xlabel("difference in validation loss [nats/token]")
        n_seeds = ds.sizes["seed"]
        # one seed (or a NaN loss) gives no interval: NaN in the table, nothing drawn
        drawn = all(np.isfinite(c["ci95"]).all() for c in comps)
        shown = "mean and 95% t interval" if drawn else \
            "mean only (no finite 95% t interval; it needs 2 seeds or more)"  # fmt: skip
        if not comps:  # one arm (reproduce --arms coupled): nothing is paired
            shown = "no paired comparison (one arm)"
            ax.text(0.5, 0.5, f"no paired comparison: arms {', '.join(arms)}", ha="center",
                    va="center", color="0.4", transform=ax.transAxes)  # fmt: skip
        ax.set_title(f"{corpus}: paired by seed ({plural(n_seeds, 'seed')}), {shown}",
                     fontsize=9.5)  # fmt: skip
        ax.legend(loc="lower left")
    fig.tight_layout()
    return fig


def plot_cost(ds, *, ax=None):
    """Cost per token against the context length `T`: measured wall-clock of one training
    step (forward + backward) per token (left) and the FLOP model's training FLOPs per token
    (right), for the dense network and the coupled one at several `P` (colour: `eps = 1/P`).

    `ds`: `wall_per_token(config, T)` and `flops_per_token(config, T)`, with `variant(config)`
    and `P(config)` (0 for dense). `ax`: two Axes, or None. Returns the Figure.
    """
    from .palette import P_color

    T = ds["T"].values
    fig, (ax_w, ax_f) = figure_axes(ax, 2, nrows=1, ncols=2, figsize=(WIDTH, 4.0))
    for k in range(ds.sizes["config"]):
        variant, P = str(ds["variant"].values[k]), int(ds["P"].values[k])
        color = arm_color("dense") if variant == "dense" else P_color(P)
        ls = ":" if variant == "dense" else "-"
        marker = "o" if variant == "dense" else "s"
        label = "dense" if variant == "dense" else f"coupled, P = {P}"
        wall = ds["wall_per_token"].values[k]
        ax_w.loglog(T, wall * 1e6, ls=ls, marker=marker, ms=4, color=color, label=label)
        if "wall_q25" in ds:
            ax_w.fill_between(T, ds["wall_q25"].values[k] * 1e6, ds["wall_q75"].values[k] * 1e6,
                              color=color, alpha=0.15, lw=0)  # fmt: skip
        ax_f.loglog(T, ds["flops_per_token"].values[k] / 1e6, ls=ls, marker=marker, ms=4,
                    color=color, label=label)  # fmt: skip
    ax_w.set_ylabel("wall-clock per token [µs]")
    ax_w.set_title(f"measured: {ds.attrs.get('device', '')}, batch {ds.attrs.get('batch', '')}",
                   fontsize=9.5)  # fmt: skip
    ax_f.set_ylabel("training FLOPs per token [MFLOP]")
    ax_f.set_title(r"FLOP model: dense $6N + 12LCT$, slow path $\approx 6N_s/P + 12LCT/P^2$",
                   fontsize=9.5)  # fmt: skip
    for a in (ax_w, ax_f):
        a.set_xscale("log", base=2)
        a.set_xlabel(axis_label(ds["T"], "context length T [tokens]"))
        a.grid(True, which="both", alpha=0.3)
        a.legend(loc="upper left")
    fig.tight_layout()
    return fig
