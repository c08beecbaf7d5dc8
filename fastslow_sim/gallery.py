"""Every figure of the project from one call: for each figure, which saved dataset it is drawn
from, how that dataset is computed when it is missing, and which plot function draws it.

    records = make_figures(out="figures", quick=False)

Datasets of the ODE figures and of the cost figure go to `results` (default `fastslow-results/`),
the training runs to `runs` (default `runs/`: `runs/reproduce-me`, `runs/reproduce-text`,
`runs/phi-sweep`, the folders `fastslow-sim reproduce` and `scripts/phi_vs_pst_sweep.py` write).
`quick=True` uses short runs (`QUICK`) under `fastslow-results/quick/`, so that it never mixes
with the full runs (`FULL`). A dataset that exists and was made by the same recipe is reused
(the gallery's own datasets record their recipe in `attrs["gallery_recipe"]`; an ablation is
matched on its corpus, tokens, seeds, arms and configuration; finished training runs of the same
configuration are reused by `training.reproduce`); a missing one is computed first, under a
progress bar that names it. The figures are drawn by `fastslow_sim.analysis` from the saved
files only (DESIGN 5), and written as PNG and PDF.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .bridge.variants import ARMS
from .errors import InputError
from .wording import plural

__all__ = ["Sizes", "FULL", "QUICK", "FIGURES", "GROUPS", "make_figures", "phi_sweep",
           "sweep_plan", "cost_dataset", "multirate_error_dataset", "DEFAULT_TEXT", "select",
           "only_choices", "uses_text"]  # fmt: skip

DEFAULT_TEXT = "../shared/data/tinyshakespeare.txt"  # the README's Shakespeare (relative to cwd)


@dataclass(frozen=True)
class Sizes:
    """The sizes of every dataset behind the figures (FULL: the README's runs; QUICK: minutes)."""

    name: str = "full"
    # ODE figures
    trajectory_eps: float = 0.125
    manifold_eps: tuple = (0.1, 0.03, 0.01)
    convergence_eps: tuple = (0.01, 0.005, 0.0025, 0.00125)
    convergence_t_end: float = 3.0
    kappa: float = 3.0
    osc_t_end: float = 20.0
    multirate_eps: tuple = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
    multirate_H: tuple = (0.2, 0.1, 0.05, 0.025, 0.0125)
    multirate_H_fixed: float = 0.05
    multirate_t_end: float = 2.0
    # training: reproduce on the me corpus and on the text
    me_corpus: str = "me"
    tokens: int = 500_000
    seeds: int = 5
    base: dict = field(default_factory=lambda: {"P": 8, "batch_size": 8, "block_size": 256})
    # phi_theta against p_st: the probe's windows and the sweep (scripts/phi_vs_pst_sweep.py)
    phi_max_windows: int = 2000
    phi_probe_windows: int = 400
    sweep_token_corpus: str = "me:tokens=2400000"
    sweep_tokens: tuple = (125_000, 500_000, 2_000_000)
    sweep_P_corpus: str = "me"
    sweep_P: tuple = (4, 8, 16)
    sweep_P_tokens: int = 500_000
    # cost against T
    cost_T: tuple = (256, 512, 1024, 2048, 4096)
    cost_P: tuple = (4, 8, 16)
    cost_model: dict = field(default_factory=lambda: {"n_layer": 4, "n_head": 4, "n_embd": 128,
                                                      "vocab_size": 256})  # fmt: skip
    cost_batch: int = 1
    cost_rounds: int = 5


FULL = Sizes()
_TINY_NET = {"P": 8, "batch_size": 8, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
             "eval_interval": 8, "eval_batches": 2, "warmup_steps": 4}  # fmt: skip
QUICK = Sizes(
    name="quick",
    # birth-death's next order is large (|x - h0| ~ eps |h1| (1 + 19 eps)): on 0.04 to 0.01 the
    # fitted slopes were 1.40, 2.65, 1.06 (theory 1, 2, 1); from 0.005 they are 1.06, 2.09, 1.01.
    # Same cost: each Radau run at rtol 1e-11 takes about 16k evaluations whatever its eps
    convergence_eps=(0.005, 0.0025, 0.00125),
    convergence_t_end=2.0,
    osc_t_end=10.0,
    multirate_eps=(1e-1, 1e-2, 1e-4, 1e-6),
    multirate_H=(0.2, 0.1, 0.05, 0.025),
    me_corpus="me:tokens=120000",
    tokens=16_384,
    seeds=2,
    base=_TINY_NET,
    phi_max_windows=400,
    phi_probe_windows=200,
    sweep_token_corpus="me:tokens=200000",
    sweep_tokens=(8_192, 16_384, 32_768),
    sweep_P_corpus="me:tokens=120000",
    sweep_P=(4, 8, 16),
    sweep_P_tokens=16_384,
    cost_T=(64, 128, 256, 512),
    cost_model={"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256},
    cost_batch=2,
    cost_rounds=2,
)


class _Context:
    """Where datasets live, and how a missing one is computed (under a progress bar)."""

    def __init__(self, sizes, out, results, runs, text, progress, compute):
        self.sizes, self.out, self.results, self.runs = sizes, out, results, runs
        self.text, self.progress, self.compute = text, progress, compute
        self.used: list = []  # (path, "reused" | "computed") of the figure being made

    def bar(self, what: str, total: int):
        from tqdm import tqdm

        return tqdm(total=total, desc=f"computing {what}", unit="step", leave=False,
                    disable=not self.progress)  # fmt: skip

    def dataset(self, path: Path, what: str, recipe: dict, compute, total: int = 1):
        """The dataset at `path` if it was made by `recipe`, else `compute(bar)` saved there
        first; returned as loaded from the file."""
        from .io import check_writable, load_dataset, save_dataset, written_by_us

        stamp = json.dumps(recipe, sort_keys=True, default=float)
        if path.is_file() and written_by_us(path):  # another file there is never read as ours
            ds = load_dataset(path)
            if not self.compute or ds.attrs.get("gallery_recipe") == stamp:
                self.used.append((str(path), "reused"))
                return ds
        if not self.compute:
            raise _MissingError(f"{what} ({path})")
        path.parent.mkdir(parents=True, exist_ok=True)
        check_writable(path, "dataset")  # a file of the user's there: refused before computing
        with self.bar(what, total) as bar:
            ds = compute(bar)
            bar.update(bar.total - bar.n)
        ds.attrs["gallery_recipe"] = stamp
        save_dataset(ds, path)
        self.used.append((str(path), "computed"))
        return load_dataset(path)


class _MissingError(Exception):
    """A dataset that is absent where nothing may be computed (`compute=False`)."""


# ---------------------------------------------------------------------------------------------
# ODE figures


def _fig_trajectory(ctx):
    from .analysis import plot_trajectory
    from .integrators import integrate
    from .systems import make_system

    eps = ctx.sizes.trajectory_eps
    ds = ctx.dataset(ctx.results / "integrate-birth-death.nc",
                     f"the birth-death trajectory at eps = {eps:g}",
                     {"system": "birth-death", "eps": eps, "t_span": [0, 5]},
                     lambda bar: integrate(make_system("birth-death", eps=eps), (0, 5)))  # fmt: skip
    return {"integrate-birth-death": plot_trajectory(ds)}


def _fig_equilibrium_manifold(ctx):
    from .analysis import plot_equilibrium_manifold
    from .integrators import integrate
    from .manifold import manifold_curve
    from .systems import make_system

    runs = []
    for e in ctx.sizes.manifold_eps:
        runs.append(ctx.dataset(ctx.results / f"equilibrium-manifold-eps{e:g}.nc",
                                f"the birth-death trajectory at eps = {e:g}",
                                {"system": "birth-death", "eps": e, "t_span": [0, 3], "n_eval": 1201},
                                lambda bar, e=e: integrate(make_system("birth-death", eps=e), (0, 3),
                                                           n_eval=1201)))  # fmt: skip
    grid = [0.7, 1.0, 121]
    curve = ctx.dataset(ctx.results / "equilibrium-manifold-curve.nc", "h0(y) and h1(y)",
                        {"system": "birth-death", "y_grid": grid},
                        lambda bar: manifold_curve(make_system("birth-death", eps=0.1),
                                                   np.linspace(*grid[:2], grid[2])))  # fmt: skip
    return {"equilibrium-manifold": plot_equilibrium_manifold(runs, curve, states=[5, 6, 7])}


def _fig_convergence(ctx):
    from .analysis import plot_convergence
    from .manifold import convergence
    from .systems import make_system

    eps, t_end = list(ctx.sizes.convergence_eps), ctx.sizes.convergence_t_end

    def compute(bar):
        return convergence(make_system("birth-death", eps=eps[0]), eps, t_end=t_end)

    ds = ctx.dataset(ctx.results / "convergence.nc",
                     f"convergence in eps ({len(eps)} Radau runs at rtol 1e-11)",
                     {"system": "birth-death", "eps": eps, "t_end": t_end}, compute)  # fmt: skip
    return {"convergence": plot_convergence(ds)}


def _fig_branches(ctx):
    from .analysis import plot_branches
    from .nonlinear import family_for, manifold_dataset

    kappa, t_end = ctx.sizes.kappa, ctx.sizes.osc_t_end
    ds = ctx.dataset(ctx.results / "nonlinear-branches.nc",
                     f"branches at kappa = {kappa:g} and the relaxation oscillation",
                     {"family": "birth-death", "kappa": kappa, "y_range": [-1.0, 1.5],
                      "osc_eps": 0.01, "osc_t_end": t_end},
                     lambda bar: manifold_dataset(family_for("birth-death", kappa), (-1.0, 1.5),
                                                  osc_eps=0.01, osc_t_end=t_end))  # fmt: skip
    return {"nonlinear-branches": plot_branches(ds)}


def multirate_error_dataset(eps_values, H_values, H_fixed, t_end=2.0, system="birth-death",
                            rtol=1e-11, atol=1e-13, bar=None):  # fmt: skip
    """Error of the multirate map (`integrate(..., method="multirate", H=H)`) against a
    tight-tolerance Radau reference, at the block ends, for every `eps` and `H`:
    `err_y = max_k |y_k - y(kH)|`, `err_x = max_{k>=1} |x_k - x(kH)|_inf`, and the fitted
    order in `H` of `err_y` per `eps` (`attrs["orders"]`). One Radau run per `eps`, on the
    block ends of the smallest `H` (every coarser `H` must be a multiple of it)."""
    import xarray as xr

    from ._version import __version__
    from .integrators import integrate
    from .solvers.multirate import whole_blocks
    from .systems import make_system

    eps_values = [float(e) for e in eps_values]
    H_values = sorted((float(h) for h in H_values), reverse=True)
    h_min = H_values[-1]
    n_fine = int(round(t_end / h_min))
    strides = [int(round(h / h_min)) for h in H_values]
    if any(abs(s * h_min - h) > 1e-12 for s, h in zip(strides, H_values)):
        raise InputError(f"every H must be a multiple of the smallest ({h_min:g}); got {H_values}.")
    for h in H_values:  # the multirate runs refuse a span of no whole blocks: before any Radau
        whole_blocks(0.0, t_end, h)
    # the block ends of the smallest H; the last is t_end itself (h_min * n_fine may round past
    # it: 0.05 * 24 = 1.2000000000000002, outside the span), the others k * h_min as before
    t_fine = h_min * np.arange(n_fine + 1)
    t_fine[-1] = t_end
    err_y = np.empty((len(eps_values), len(H_values)))
    err_x = np.empty_like(err_y)
    ref_wall = np.empty(len(eps_values))
    for i, e in enumerate(eps_values):
        s = make_system(system, eps=e)
        t0 = time.perf_counter()
        ref = integrate(s, (0.0, t_end), method="radau", rtol=rtol, atol=atol,
                        t_eval=t_fine)  # fmt: skip
        ref_wall[i] = time.perf_counter() - t0
        for j, (h, stride) in enumerate(zip(H_values, strides)):
            run = integrate(s, (0.0, t_end), method="multirate", H=h)
            if run.attrs["status"] != "success":  # its NaN rows would be an error of NaN
                raise InputError(f"the multirate map at eps = {e:g}, H = {h:g} did not reach "
                                 f"t_end ({run.attrs['message']}); expected H and eps that it "
                                 f"runs through.")  # fmt: skip
            y_ref = ref["y"].values[::stride]
            x_ref = ref["x"].values[::stride]
            err_y[i, j] = np.max(np.abs(run["y"].values - y_ref))
            err_x[i, j] = np.max(np.abs(run["x"].values[1:] - x_ref[1:]))
        if bar is not None:
            bar.update(1)
    logH = np.log(H_values)
    orders = [float(np.polyfit(logH, np.log(err_y[i]), 1)[0]) for i in range(len(eps_values))]
    return xr.Dataset(
        {
            "err_y": (("eps", "H"), err_y, {"long_name": "max_k |y_k - y(kH)| (slow)"}),
            "err_x": (("eps", "H"), err_x,
                      {"long_name": "max_{k>=1} |x_k - x(kH)|_inf (fast, after the first block)"}),
            "reference_wall_s": ("eps", ref_wall, {"long_name": "wall-clock of the Radau run",
                                                   "units": "s"}),
        },  # fmt: skip
        coords={"eps": ("eps", eps_values, {"long_name": "eps = 1/P"}),
                "H": ("H", H_values, {"long_name": "slow time per block H"})},  # fmt: skip
        attrs={"title": "multirate map against the ODE", "system": system, "t_end": t_end,
               "H_fixed": float(H_fixed), "reference": f"scipy Radau, rtol {rtol:g}, atol {atol:g}",
               "orders": json.dumps(orders), "fastslow_sim_version": __version__},  # fmt: skip
    )


def _fig_multirate(ctx):
    from .analysis import plot_multirate

    s = ctx.sizes
    H = sorted(set(s.multirate_H) | {s.multirate_H_fixed}, reverse=True)
    ds = ctx.dataset(ctx.results / "multirate-map.nc",
                     f"the multirate map against Radau ({len(s.multirate_eps)} eps x {len(H)} H)",
                     {"system": "birth-death", "eps": list(s.multirate_eps), "H": H,
                      "H_fixed": s.multirate_H_fixed, "t_end": s.multirate_t_end},
                     lambda bar: multirate_error_dataset(s.multirate_eps, H, s.multirate_H_fixed,
                                                         s.multirate_t_end, bar=bar),
                     total=len(s.multirate_eps))  # fmt: skip
    return {"multirate-map": plot_multirate(ds)}


# ---------------------------------------------------------------------------------------------
# training figures


def _corpora(ctx) -> dict:
    """`{name: corpus spec}` of the ablations: me always, the text where its file exists (or,
    when nothing is computed, where its saved ablation exists: reading needs no text file)."""
    out = {"me": ctx.sizes.me_corpus}
    if ctx.text is not None and Path(ctx.text).is_file():
        out["text"] = f"text:{ctx.text}"
    elif not ctx.compute and (ctx.runs / "reproduce-text" / "ablation.nc").is_file():
        out["text"] = "text"  # only read: the spec is not compared
    return out


def _ablation_matches(ds, spec: str, sizes: Sizes) -> bool:
    from .corpora import corpus_fingerprint, same_text_corpus
    from .training import _ADDED_LATER, _RESUME_FREE, TrainConfig

    a = ds.attrs
    # the tokens asked for (a file written before "tokens_requested": its "tokens" were those)
    requested = int(a.get("tokens_requested", a.get("tokens", -1)))
    if requested != sizes.tokens:
        return False
    try:
        held_sha = json.loads(a.get("corpus_summary", "{}")).get("sha256")
    except (ValueError, TypeError, AttributeError):
        held_sha = None
    if a.get("corpus") != spec:  # another spelling of the text file's path, on its contents
        if not same_text_corpus(a.get("corpus"), held_sha, spec):
            return False
    elif spec.startswith("text:") and held_sha and held_sha != corpus_fingerprint(spec):
        return False  # the file has changed since: its figures would show the old contents
    if ds.sizes.get("seed") != sizes.seeds or list(ds["arm"].values) != list(ARMS):
        return False
    saved, defaults = json.loads(a.get("base_config", "{}")), asdict(TrainConfig())
    # the settings added later at their old value too (a shifted-grid control is not the paper's)
    return all(saved.get(k, defaults.get(k)) == v for k, v in {**_ADDED_LATER, **sizes.base}.items()
               if k not in _RESUME_FREE)  # fmt: skip


def _checked_ablation(path: Path):
    """`reproduce`'s ablation.nc at `path`, loaded; an `InputError` naming it when fastslow-sim
    did not write it or it lacks what the figures read (a file of the user's is never read as
    ours, as `_Context.dataset` does for the ODE datasets)."""
    from .io import load_dataset, written_by_us

    expected = "expected the ablation.nc that fastslow-sim reproduce writes there"
    if not written_by_us(path):
        load_dataset(path)  # one that is no NetCDF-4 at all (ours, cut short?) is refused as that
        raise InputError(f"the ablation results {str(path)!r} were not written by fastslow-sim; "
                         f"{expected}.")  # fmt: skip
    ds = load_dataset(path)
    lack = [v for v in ("arm", "seed", "val_loss", "wall_time_s") if v not in ds.variables]
    lack += [a for a in ("corpus", "tokens", "table", "corpus_summary") if a not in ds.attrs]
    if lack:
        raise InputError(f"the ablation results {str(path)!r} lack {', '.join(lack)}; "
                         f"{expected}.")  # fmt: skip
    return ds


def _checked_json(path: Path, what: str, check) -> dict | list:
    """The JSON at `path`; an `InputError` naming it when it is no JSON or `check(data)` finds
    it is not the structure that `what` has."""
    try:
        data = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if data is None or not check(data):
        raise InputError(f"the file {str(path)!r} is not {what} that fastslow-sim can read; "
                         f"expected the file it writes there (remove or move this one).")  # fmt: skip
    return data


def _ablations(ctx, corpora=("me", "text")) -> dict:
    """`{corpus name: run folder}` of finished ablations of `corpora` (those of them that
    `_corpora` has), running `reproduce` where missing."""
    from .training import reproduce

    s = ctx.sizes
    dirs = {}
    for name, spec in _corpora(ctx).items():
        if name not in corpora:
            continue
        folder = ctx.runs / f"reproduce-{name}"
        path = folder / "ablation.nc"
        # a file there is read by the figures or compared with the run asked for: checked first
        if path.is_file() and (_ablation_matches(_checked_ablation(path), spec, s)
                               or not ctx.compute):  # fmt: skip
            ctx.used.append((str(path), "reused"))
            dirs[name] = folder
            continue
        if not ctx.compute:
            continue
        base = {**s.base, "progress": False}
        with ctx.bar(f"the ablation on {name} ({len(ARMS)} arms x {plural(s.seeds, 'seed')}, "
                     f"{s.tokens:,} tokens each)", len(ARMS) * s.seeds) as bar:  # fmt: skip
            # the bar moves as each run finishes (`reproduce` logs its per-run lines only once
            # the whole grid is done: they are not shown under the bar); runs reused from an
            # earlier, interrupted call are not reported, and fill the bar at the end
            reproduce(spec, s.tokens, s.seeds, ARMS, str(folder), base, log=lambda msg: None,
                      on_chunk=lambda results, chunk: bar.update(len(chunk)),
                      names={"run_folders": "--runs of figures"})  # fmt: skip
            if bar.n < bar.total:
                bar.update(bar.total - bar.n)
        ctx.used.append((str(path), "computed"))
        dirs[name] = folder
    if not dirs:
        raise _MissingError(f"no ablation results under {str(ctx.runs)!r}; run fastslow-sim reproduce "
                       f"first")  # fmt: skip
    return dirs


def _run_logs(ctx, dirs: dict) -> dict:
    """`dirs`, with the runs' train.nc that the training curves read recorded in `ctx.used` as
    one pattern per ablation folder (`FOLDER/ARM-seedS/train.nc`), reused or computed with it."""
    how = dict(ctx.used)
    for folder in dirs.values():
        ctx.used.append((str(folder / "ARM-seedS" / "train.nc"),
                         how.get(str(folder / "ablation.nc"), "reused")))  # fmt: skip
    return dirs


def _fig_gates(ctx):
    from .analysis import plot_gates

    dirs = _run_logs(ctx, _ablations(ctx, FIGURES["training-gates"].corpora))
    return {"training-gates": plot_gates(dirs)}


_REFERENCES = {"oracle": "oracle_loss", "Bayes floor": "bayes_floor_loss",
               "ignore-y": "ignore_y_loss"}  # fmt: skip


def _references(dirs) -> dict:
    """`{"me": {name: loss}}`: the me ablation's reference losses, from its table (computed on
    the validation windows of its final losses, at the runs' context length) or, in a file
    without them there, its corpus summary. Those it lacks (an ablation of another corpus under
    reproduce-me) are not drawn, with a warning."""
    import warnings

    from .io import load_dataset

    if "me" not in dirs:
        return {}
    path = dirs["me"] / "ablation.nc"
    attrs = load_dataset(path).attrs
    held = {}
    for key in ("corpus_summary", "table"):
        try:
            held[key] = json.loads(attrs.get(key, "{}"))
        except ValueError:
            held[key] = None
        held[key] = held[key] if isinstance(held[key], dict) else {}
    summary = held["corpus_summary"]
    table = held["table"].get("references")
    source = table if isinstance(table, dict) else summary
    refs = {name: float(source[k]) for name, k in _REFERENCES.items()
            if isinstance(source.get(k), (int, float))}  # fmt: skip
    lack = [k for name, k in _REFERENCES.items() if name not in refs]
    if lack:
        where = "table" if source is table else "corpus summary"
        warnings.warn(f"the ablation results {str(path)!r} (corpus {summary.get('corpus')!r}) "
                      f"hold no {', '.join(lack)} in their {where}, which the me corpus "
                      f"has; the validation loss is drawn without those references.",
                      stacklevel=2)  # fmt: skip
    return {"me": refs} if refs else {}


def _fig_val_loss(ctx):
    from .analysis import plot_val_loss

    dirs = _run_logs(ctx, _ablations(ctx, FIGURES["training-val-loss"].corpora))
    return {"training-val-loss": plot_val_loss(dirs, _references(dirs))}


def _fig_ablation(ctx):
    from .analysis import plot_ablation
    from .io import load_dataset

    dirs = _ablations(ctx, FIGURES["training-ablation"].corpora)
    return {"training-ablation": plot_ablation({k: load_dataset(v / "ablation.nc")
                                                for k, v in dirs.items()})}  # fmt: skip


def _fig_wall_clock(ctx):
    from .analysis import plot_wall_clock

    dirs = _ablations(ctx, FIGURES["training-wall-clock"].corpora)
    return {"training-wall-clock": plot_wall_clock(dirs)}


def _phi_result(ctx, run: Path, what: str) -> dict:
    """`run/phi_vs_pst.json` if it is newer than the run's checkpoint, else computed there."""
    from .probe import phi_vs_pst

    path, ckpt = run / "phi_vs_pst.json", run / "ckpt.pt"
    if path.is_file() and (not ckpt.is_file() or path.stat().st_mtime >= ckpt.stat().st_mtime):
        ctx.used.append((str(path), "reused"))
        return _checked_json(path, "a phi_theta against p_st result", lambda d: isinstance(
            d, dict) and all(k in d for k in ("arm", "tv", "binned")))  # fmt: skip
    if not ctx.compute:  # absent, or older than the run beside it (retrained since)
        stale = ", older than its run's checkpoint" if path.is_file() else ""
        raise _MissingError(f"{what} ({path}{stale})")
    with ctx.bar(what, 1):
        r = phi_vs_pst(run, max_windows=ctx.sizes.phi_max_windows,
                       probe_windows=ctx.sizes.phi_probe_windows)  # fmt: skip
    ctx.used.append((str(path), "computed"))
    return r


def _fig_phi_vs_pst(ctx):
    from .analysis import plot_phi_vs_pst

    dirs = _ablations(ctx, FIGURES["phi-vs-pst"].corpora)
    if "me" not in dirs:
        raise _MissingError("the me ablation (phi_theta against p_st needs the me corpus)")
    results = {}
    for arm in ARMS:
        run = dirs["me"] / f"{arm}-seed0"
        if run.is_dir():
            results[arm] = _phi_result(ctx, run, f"phi_theta against p_st for {arm}, seed 0")
    if not results:
        raise _MissingError(f"phi_vs_pst.json in {dirs['me']}")
    return {"phi-vs-pst": plot_phi_vs_pst(results)}


def sweep_plan(sizes: Sizes = FULL) -> list:
    """`[(sweep, corpus, arm, tokens, P)]` of the phi-vs-pst sweep: tokens at P = 8 on a long me
    corpus, and P at a fixed budget (each P its own me corpus), coupled and dense-matched."""
    plan = [("tokens", sizes.sweep_token_corpus, arm, tok, 8)
            for tok in sizes.sweep_tokens for arm in ("coupled", "dense-matched")]  # fmt: skip
    plan += [("P", sizes.sweep_P_corpus, arm, sizes.sweep_P_tokens, P)
             for P in sizes.sweep_P for arm in ("coupled", "dense-matched")]  # fmt: skip
    return plan


def _sweep_folder(out: Path, sweep, arm, tokens, P, seed) -> Path:
    return out / f"{arm}-{'tok' if sweep == 'tokens' else 'P'}{P}-{tokens}-seed{seed}"


def phi_sweep(out, plan, seed: int = 0, base: dict | None = None, max_windows: int = 2000,
              probe_windows: int = 400, bar=None, log=None) -> list:  # fmt: skip
    """Train (or reuse) one run per point of `plan` (`sweep_plan`) under `out` and measure its
    distance to `p_st` (`probe.phi_vs_pst`); returns the rows, also written to
    `out/phi_vs_pst_sweep.json`. A finished run folder is reused."""
    from .corpora import load_corpus
    from .io import check_writable, save_json
    from .probe import phi_vs_pst
    from .training import TrainConfig, arm_config, train

    out = Path(out)
    if out.is_dir():  # refused before hours of training, not after
        check_writable(out / "phi_vs_pst_sweep.json", "phi-vs-pst sweep")
    rows = []
    for sweep, corpus, arm, tokens, P in plan:
        folder = _sweep_folder(out, sweep, arm, tokens, P, seed)
        summary = folder / "summary.json"
        if not (summary.is_file() and json.loads(summary.read_text()).get("finished")):
            b = {**(base or {}), "P": P, "progress": False}
            c = load_corpus(corpus, P=P, context=b.get("block_size", 256))
            cfg = TrainConfig(corpus=corpus, tokens=tokens, seed=seed, out=str(folder),
                              **arm_config(arm, b, c.vocab_size))  # fmt: skip
            s = train(cfg, c)
            if log is not None:
                log(f"  trained {folder.name}: val {s['val_loss']:.4f} in {s['wall_time_s']:.0f} s")
        r = phi_vs_pst(folder, max_windows=max_windows, probe_windows=probe_windows)
        rows.append({"sweep": sweep, **{k: v for k, v in r.items() if k != "binned"}})
        if bar is not None:
            bar.update(1)
    out.mkdir(parents=True, exist_ok=True)
    save_json({"rows": rows}, out / "phi_vs_pst_sweep.json", "phi-vs-pst sweep")
    return rows


def sweep_rows(path: Path) -> list:
    """The rows of a `phi_vs_pst_sweep.json` (`{"rows": [...]}`, or the bare list of a file
    written before fastslow-sim marked its JSON files)."""
    def rows(data):
        return data.get("rows") if isinstance(data, dict) else data

    refs = ("Bayes filter, head readout", "Bayes filter p_st", "corpus frequencies")

    def well_formed(data):  # what `_fig_phi_sweep` and `plot_tv_sweep` read of each row
        r = rows(data)
        return isinstance(r, list) and all(
            isinstance(row, dict) and all(k in row for k in ("sweep", "arm", "run", "tv"))
            and row["sweep"] in ("tokens", "P") and isinstance(row.get(row["sweep"]), (int, float))
            and isinstance(row["tv"], dict) and all(k in row["tv"] for k in refs)
            and all(isinstance(v, dict) and "mean" in v and "se" in v for v in row["tv"].values())
            for row in r)  # fmt: skip

    r = rows(_checked_json(path, "a phi-vs-pst sweep ({\"rows\": [...]})", well_formed))
    if not r:  # a figure of no point: refused here, where the file can be named
        raise InputError(f"the phi-vs-pst sweep {str(path)!r} holds no rows; expected at least "
                         f"one row (rerun scripts/phi_vs_pst_sweep.py or remove the file).")  # fmt: skip
    for row in r:  # strict JSON holds a NaN (the standard error of one window) as null
        row["tv"] = {k: {m: math.nan if x is None else x for m, x in v.items()}
                     for k, v in row["tv"].items()}  # fmt: skip
    return r


def _no_rows(path) -> bool:
    """Whether the phi-vs-pst sweep file at `path` is JSON holding an empty list of rows."""
    try:
        held = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False  # not ours to judge here: `sweep_rows` refuses it in its own words
    return held == [] or (isinstance(held, dict) and held.get("rows") == [])


def _fig_phi_sweep(ctx):
    from .analysis import plot_tv_sweep

    s = ctx.sizes
    out = ctx.runs / "phi-sweep"
    path = out / "phi_vs_pst_sweep.json"
    plan = sweep_plan(s)
    want = {_sweep_folder(out, sw, arm, tok, P, 0).name for sw, _, arm, tok, P in plan}
    # a sweep file of no rows is refused where the figure reads it; computing, it is redone
    empty = ctx.compute and path.is_file() and _no_rows(path)
    rows = sweep_rows(path) if path.is_file() and not empty else None
    if rows is not None and (not ctx.compute or want <= {Path(r["run"]).name for r in rows}):
        ctx.used.append((str(path), "reused"))
    elif not ctx.compute:
        raise _MissingError(f"the phi-vs-pst sweep ({path})")
    else:
        base = {k: v for k, v in s.base.items() if k != "P"}
        with ctx.bar(f"the phi-vs-pst sweep ({plural(len(plan), 'run')}: tokens and P)",
                     len(plan)) as bar:  # fmt: skip
            rows = phi_sweep(out, plan, base=base, max_windows=s.phi_max_windows,
                             probe_windows=s.phi_probe_windows, bar=bar)  # fmt: skip
        ctx.used.append((str(path), "computed"))
    return {"phi-vs-pst-sweep": plot_tv_sweep(rows)}


# ---------------------------------------------------------------------------------------------
# cost against T


COST_THREADS = 1  # the cost figure's torch threads (figures/README.md: "CPU, one thread")


def cost_dataset(T_values, P_values, model: dict, batch: int = 1, rounds: int = 3, seed: int = 0,
                 bar=None, threads: int | None = 1):  # fmt: skip
    """Wall-clock of one training step (forward + backward, no optimiser) per token, and the
    FLOP model's training FLOPs per token (`bridge.cost.flops_per_token`), against the context
    length `T`, for the dense network and the coupled one at every `P`. Each (config, T) is
    timed once per round, rounds interleaved, after one warm-up step; the median over rounds
    is kept, with the quartiles. On the device torch picks (CPU here), float32, on `threads`
    torch intra-op threads (`threads.torch_threads`: torch's setting restored after; `None`:
    torch's own), recorded in `attrs["device"]`."""
    from .threads import check_threads, torch_threads

    if threads is not None:  # torch's RuntimeError otherwise
        threads = check_threads(threads)
    with torch_threads(threads):
        return _cost_dataset(T_values, P_values, model, batch, rounds, seed, bar)


def _cost_dataset(T_values, P_values, model, batch, rounds, seed, bar):
    import torch
    import xarray as xr

    from ._version import __version__
    from .bridge import BridgeConfig, FastSlowLM
    from .bridge.cost import flops_per_token

    T_values = [int(t) for t in T_values]
    configs = [("dense", 0)] + [("coupled", int(P)) for P in P_values]
    T_max = max(T_values)
    models, flops = [], np.empty((len(configs), len(T_values)))
    for k, (variant, P) in enumerate(configs):
        cfg = BridgeConfig(block_size=T_max, P=P or 8, variant=variant, **model)
        torch.manual_seed(seed)
        models.append(FastSlowLM(cfg))
        for j, T in enumerate(T_values):
            flops[k, j] = flops_per_token(cfg, T)["train"]
    gen = torch.Generator().manual_seed(seed)
    V = int(model.get("vocab_size", 256))
    data = {T: torch.randint(0, V, (batch, T + 1), generator=gen) for T in T_values}

    def step(m, T):
        idx = data[T]
        t0 = time.perf_counter()
        _, loss = m(idx[:, :-1], idx[:, 1:])
        loss.backward()
        dt = time.perf_counter() - t0
        m.zero_grad(set_to_none=True)
        return dt

    times = np.empty((rounds, len(configs), len(T_values)))
    for m in models:
        for T in T_values:
            step(m, T)  # warm-up
    for r in range(rounds):
        for j, T in enumerate(T_values):
            for k, m in enumerate(models):
                times[r, k, j] = step(m, T)
        if bar is not None:
            bar.update(1)
    per_token = times / (batch * np.array(T_values))
    names = [v if v == "dense" else f"{v} P={P}" for v, P in configs]
    return xr.Dataset(
        {
            "wall_per_token": (("config", "T"), np.median(per_token, 0),
                               {"long_name": "wall-clock per token, forward + backward (median)",
                                "units": "s"}),
            "wall_q25": (("config", "T"), np.quantile(per_token, 0.25, axis=0),
                         {"long_name": "first quartile over rounds", "units": "s"}),
            "wall_q75": (("config", "T"), np.quantile(per_token, 0.75, axis=0),
                         {"long_name": "third quartile over rounds", "units": "s"}),
            "flops_per_token": (("config", "T"), flops,
                                {"long_name": "training FLOPs per token (FLOP model)",
                                 "units": "FLOP"}),
        },  # fmt: skip
        coords={"config": names, "T": ("T", T_values, {"long_name": "context length T",
                                                       "units": "tokens"}),
                "variant": ("config", [v for v, _ in configs]),
                "P": ("config", [P for _, P in configs], {"long_name": "block length P (0: dense)"})},  # fmt: skip
        attrs={"title": "cost per token against T", "model": json.dumps(model), "batch": batch,
               "rounds": rounds, "seed": seed, "device": f"cpu, {torch.get_num_threads()} thread(s)",
               "dtype": "float32", "torch": str(torch.__version__),
               "fastslow_sim_version": __version__},  # fmt: skip
    )


def _fig_cost(ctx):
    from .analysis import plot_cost

    s = ctx.sizes
    ds = ctx.dataset(ctx.results / "cost.nc",
                     f"wall-clock per token against T ({len(s.cost_T)} T x "
                     f"{1 + len(s.cost_P)} networks x {plural(s.cost_rounds, 'round')})",
                     {"T": list(s.cost_T), "P": list(s.cost_P), "model": s.cost_model,
                      "batch": s.cost_batch, "rounds": s.cost_rounds, "threads": COST_THREADS},
                     lambda bar: cost_dataset(s.cost_T, s.cost_P, s.cost_model, s.cost_batch,
                                              s.cost_rounds, bar=bar, threads=COST_THREADS),
                     total=s.cost_rounds)  # fmt: skip
    return {"cost": plot_cost(ds)}


# ---------------------------------------------------------------------------------------------

class Figure(NamedTuple):
    """A figure of the gallery: its group, its recipe, what it shows (one line, for `fastslow-sim
    figures --help`), and the ablations it reads (`corpora`: "me", "text"; none for the others)."""

    group: str
    recipe: Callable
    shows: str
    corpora: tuple = ()


# name -> Figure; the name is the file stem of the figure
FIGURES = {
    "integrate-birth-death": Figure("ode", _fig_trajectory,
                                    "x_i(t), p_st(y(t)) and y(t), birth-death system"),
    "equilibrium-manifold": Figure("ode", _fig_equilibrium_manifold,
                                   "trajectories onto h0 = p_st(y) and h0 + eps h1"),
    "convergence": Figure("ode", _fig_convergence,
                          "errors to the slow manifold against eps, with slopes"),
    "nonlinear-branches": Figure("ode", _fig_branches,
                                 "non-linear critical manifold, folds, relaxation cycle"),
    "multirate-map": Figure("ode", _fig_multirate,
                            "multirate map's error against Radau, over eps and H"),
    "training-gates": Figure("training", _fig_gates,
                             "|tanh(alpha)| per layer during training (me, text)",
                             ("me", "text")),
    "training-val-loss": Figure("training", _fig_val_loss,
                                "validation loss per arm against step (me, text)",
                                ("me", "text")),
    "training-ablation": Figure("training", _fig_ablation,
                                "paired final-loss differences of the arms (me, text)",
                                ("me", "text")),
    "training-wall-clock": Figure("training", _fig_wall_clock,
                                  "wall-clock per training run of every arm (me, text)",
                                  ("me", "text")),
    "phi-vs-pst": Figure("training", _fig_phi_vs_pst,
                         "phi_theta(y) against p_st(y) per state (me)", ("me",)),
    "phi-vs-pst-sweep": Figure("training", _fig_phi_sweep,
                               "TV of phi_theta to p_st against tokens and P (me)"),
    "cost": Figure("cost", _fig_cost, "cost per token against context length T: time, FLOPs"),
}  # fmt: skip
GROUPS = ("ode", "training", "cost")


def only_choices() -> list:
    """What `--only` takes: the groups, then the figure names (`cost` is both, named once)."""
    return list(GROUPS) + [n for n in FIGURES if n not in GROUPS]


def uses_text(names) -> bool:
    """Whether any of the figures `names` reads the text corpus's ablation."""
    return any("text" in FIGURES[n].corpora for n in names)


def _outputs(name: str, ctx) -> list:
    """`[(path, what)]`: the files that figure `name` may write besides its own, checked before
    any figure is made (a file of the user's at the last of them would otherwise be refused only
    after the work before it, hours of training for `cost.nc`)."""
    res, runs, s = ctx.results, ctx.runs, ctx.sizes
    ablations = [(runs / f"reproduce-{c}" / "ablation.nc", "ablation") for c in _corpora(ctx)
                 if c in FIGURES[name].corpora]  # fmt: skip
    table = {
        "integrate-birth-death": [(res / "integrate-birth-death.nc", "dataset")],
        "equilibrium-manifold": [(res / f"equilibrium-manifold-eps{e:g}.nc", "dataset")
                                 for e in s.manifold_eps]
        + [(res / "equilibrium-manifold-curve.nc", "dataset")],
        "convergence": [(res / "convergence.nc", "dataset")],
        "nonlinear-branches": [(res / "nonlinear-branches.nc", "dataset")],
        "multirate-map": [(res / "multirate-map.nc", "dataset")],
        "phi-vs-pst-sweep": [(runs / "phi-sweep" / "phi_vs_pst_sweep.json", "phi-vs-pst sweep")],
        "cost": [(res / "cost.nc", "dataset")],
    }  # fmt: skip
    if FIGURES[name].corpora:
        return ablations
    return table[name]


def select(only) -> list:
    """Figure names from `only` (None: all; else names and groups, a list or a comma string)."""
    if only is None:
        return list(FIGURES)
    items = [w.strip() for w in (only.split(",") if isinstance(only, str) else only) if w.strip()]
    bad = [w for w in items if w not in FIGURES and w not in GROUPS]
    if bad or not items:
        raise InputError(f"--only must name figures or groups out of {only_choices()}; got "
                         f"{only!r}.")  # fmt: skip
    return [n for n, f in FIGURES.items() if n in items or f.group in items]


def _folder(path, what) -> Path:
    from .validation import folder

    return folder(path, what)


def make_figures(out=None, quick: bool = False, results=None, runs=None, text=DEFAULT_TEXT,
                 only=None, progress: bool = True, compute: bool = True,
                 sizes: Sizes | None = None) -> list:  # fmt: skip
    """Make the figures named by `only` (default all, see `FIGURES`) into `out`, each as PNG
    and PDF, computing missing datasets first (`compute=False`: skip a figure whose data is
    missing). Returns one record per figure: `{"name", "files", "seconds", "datasets"}` with
    `datasets` a list of `(path, "reused" | "computed")` of what it read (a path with `ARM-seedS`:
    every run of that ablation), or `"skipped"` with the reason."""
    from .analysis import palette, save_figure
    from .io import check_parent, check_writable

    sizes = sizes or (QUICK if quick else FULL)
    out_given, results_given, runs_given = out is not None, results is not None, runs is not None
    root = Path("fastslow-results") / ("quick" if sizes.name == "quick" else "")
    out = _folder(out if out is not None else (root / "figures" if sizes.name == "quick"
                                                else "figures"), "figure folder")  # fmt: skip
    results = _folder(results if results is not None else root, "results folder")
    runs = _folder(runs if runs is not None else (root / "runs" if sizes.name == "quick" else "runs"),
                   "runs folder")  # fmt: skip
    # a folder given is made, but not the folders above it (a typo there would scatter the
    # figures, or start hours of training in it); the defaults are the gallery's own, made as
    # needed. The runs folder is written only when computing a training figure (`compute=False`
    # only reads it: a missing one is a figure skipped, not an error)
    names = select(only)
    runs_used = any(FIGURES[n].group == "training" for n in names)
    for given, folder, what in ((out_given, out, "figure folder"),
                                (results_given, results, "results folder"),
                                (runs_given and compute and runs_used, runs, "runs folder")):  # fmt: skip
        if given and not folder.exists():
            check_parent(folder, what)
    if out.is_dir():  # a figure file there that fastslow-sim did not write: refused up front
        for name in names:
            for suffix in (".png", ".pdf"):
                check_writable(out / f"{name}{suffix}", "figure")
    ctx = _Context(sizes, out, results, runs, text, progress, compute)
    if compute:  # the same for every dataset the figures may write, before any is computed
        for name in names:
            for path, what in _outputs(name, ctx):
                if path.parent.is_dir():
                    check_writable(path, what)
    records = []
    for name in names:
        recipe = FIGURES[name].recipe
        ctx.used = []
        t0 = time.perf_counter()
        with palette.style():
            try:
                figs = recipe(ctx)
            except _MissingError as err:
                records.append({"name": name, "files": [], "seconds": time.perf_counter() - t0,
                                "datasets": ctx.used, "skipped": f"missing {err}"})  # fmt: skip
                continue
            out.mkdir(parents=True, exist_ok=True)
            files = []
            for stem, fig in figs.items():
                files.append(str(save_figure(fig, out / f"{stem}.png", dpi=150, close=False)))
                files.append(str(save_figure(fig, out / f"{stem}.pdf")))
        records.append({"name": name, "files": files, "seconds": time.perf_counter() - t0,
                        "datasets": ctx.used})  # fmt: skip
    return records
