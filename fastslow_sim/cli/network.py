"""The network commands: `corpus`, `train-network`, `reproduce`, `phi-vs-pst`."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import numpy as np

from ..bridge.variants import VARIANTS
from ..errors import InputError
from ..wording import int_text, plural
from .common import (
    INTEGER,
    NUMBER,
    check_cluster_options,
    in_runs,
    json_text,
    parse_eps_P,
    path_given,
    solver_warnings,
)


@click.command()
@click.argument("spec", metavar="me|me:NAME=VALUE,...|random|text:PATH")
@click.option("--P", "P", default="8", show_default=True,
              help="Block length of the me corpus: tokens per slow step (small P: more blocks, "
                   "a slower build).")  # fmt: skip
@click.option(
    "--context",
    default=256,
    show_default=True,
    type=INTEGER,
    help="Window length T of the me corpus's reference losses (the training context).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def corpus(spec, P, context, as_json):
    """Statistics of a corpus and, for the master-equation corpus, its three reference losses
    on the validation windows of length T (block-aligned, the targets the network is scored
    on): the oracle with y known, the Bayes floor (the best predictor from the window's past
    tokens: an exact filter over the slow state) and the best predictor that ignores y.

    Building the me corpus is a loop over its blocks and tokens, so its time grows with the
    tokens and with their number of blocks, tokens/P: the default 1.2M tokens take about 15 s
    at P = 8 and 30 s at --P 1 on a shared two-core machine (me:tokens=120k, a tenth of that),
    under a progress bar on a terminal.

    The me corpus's blocks are P tokens long, the model's P, unless its spec sets block=N: a
    control whose pooling grid is not the corpus's (train-network --P 7 on me:block=8).

    \b
    Examples:
      fastslow-sim corpus me
      fastslow-sim corpus me:tokens=3M,beta=6 --json
      fastslow-sim corpus text:../shared/data/tinyshakespeare.txt --json
    """
    from ..corpora import load_corpus
    given = [f"--{name}" for name in ("P", "context")
             if click.get_current_context().get_parameter_source(name).name == "COMMANDLINE"]  # fmt: skip
    if given and (spec == "random" or spec.startswith("text:")):  # no blocks, no windows
        verb, it = ("applies", "it") if len(given) == 1 else ("apply", "them")
        raise InputError(f"{' and '.join(given)} {verb} to the me corpus only; got {it} with "
                         f"the corpus {spec!r}.")  # fmt: skip
    _, P_int = parse_eps_P(None, P)
    if context < 1:
        raise InputError(f"--context must be a positive integer; got {context}.")
    from ..me_corpus import parse_me_spec
    me = parse_me_spec(spec, P=P_int, context=context)
    if me is not None and context % me.P:
        # the references are for the windows a run trains on, and train-network refuses these
        what = f"P={P_int} (--P)" if me.P == P_int else f"the block length {me.P} (block={me.P} in the spec)"
        raise InputError(f"the context {context} (--context) is not a multiple of {what}; "
                         f"expected whole blocks per window, as train-network does.")  # fmt: skip
    c = load_corpus(spec, P=P_int, context=context, progress=True)
    info = c.summary()
    if as_json:
        click.echo(json_text(info))
        return
    click.echo(
        f"corpus {info['corpus']}: {plural(info['tokens'], 'token', spec=',')} (train "
        f"{info['train_tokens']:,}, "
        f"validation {info['val_tokens']:,}), vocabulary {info['vocab_size']}"
    )
    if "oracle_loss" in info:
        click.echo(f"reference losses on {plural(info['reference_windows'], 'validation window')} "
                   f"of {plural(info['reference_context'], 'target')} (nats/token):")  # fmt: skip
        click.echo(f"  oracle (y known)                   {info['oracle_loss']:.4f}")
        click.echo(f"  Bayes floor (past tokens only)     {info['bayes_floor_loss']:.4f}")
        click.echo(f"  ignore-y (fixed transition matrix) {info['ignore_y_loss']:.4f}")
        click.echo(f"  uniform                            {info['uniform_loss']:.4f}")
        click.echo(f"  learnable gap ignore-y - floor     {info['loss_gap']:.4f}")
        click.echo(
            f"y from {info['y_p05']:.3f} to {info['y_p95']:.3f} (5th to 95th percentile), "
            f"forgets its start within {plural(info['y_memory_blocks'], 'block')}; P = {info['P']}"
        )
    if "note" in info:
        click.echo(f"note: {info['note']}")
    if "floor_loss" in info:
        click.echo(f"floor loss ln V = {info['floor_loss']:.4f}")


def _train_options(f):
    options = [
        click.option("--corpus", "corpus_spec", default="me", show_default=True,
                     metavar="me|random|text:PATH", help="Training corpus."),
        click.option("--tokens", default="500k", show_default=True,
                     help="Training tokens per run: 500k, 2M or a plain integer."),
        click.option("--P", "P", default="8", show_default=True, help="Pooling ratio (eps = 1/P)."),
        click.option("--pool-offset", default=0, show_default=True, type=INTEGER, metavar="O",
                     help="First token of the pooling grid, 0 to P-1: blocks are tokens "
                          "O+jP..O+jP+P-1 and tokens before O read the null state. A control of "
                          "where the blocks fall (--pool-offset 4 at P = 8 moves them half a "
                          "block off the me corpus's); phi-vs-pst needs 0."),
        click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda."),
        click.option("--batch-size", default=8, show_default=True, type=INTEGER),
        click.option("--context", "block_size", default=256, show_default=True, type=INTEGER,
                     help="Context length T."),
        click.option("--compile", "use_compile", is_flag=True, help="Use torch.compile."),
        click.option("--threads", default=None, type=INTEGER, metavar="N",
                     help="torch's CPU threads [default: torch's own]. On a machine shared with "
                          "other work, 1 ran small networks 2.0-3.0x faster (two cores, batch "
                          "2-8 x context 64-256); idle, it took 1.04-1.54x as long."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


# how train-network and reproduce call the TrainConfig fields that are their options, so that
# the library's messages name the option a user typed (`training.train`'s `names`)
OPTION_NAMES = {"tokens": "--tokens", "batch_size": "--batch-size", "block_size": "--context",
                "ckpt_interval": "--checkpoint-every", "seed": "--seed",
                "threads": "--threads", "retry_failed": "--retry-failed", "variant": "--variant",
                "corpus": "--corpus", "P": "--P", "pool_offset": "--pool-offset",
                "out": "--out"}  # fmt: skip


def _base_config(P, pool_offset, device, batch_size, block_size, use_compile, threads):
    from ..validation import as_int, no_underscore

    no_underscore("--P", P)
    try:  # exactly, as parse_eps_P reads it; its range is `training._validate`'s, naming --P
        P_int = as_int(P)
    except (ValueError, OverflowError):
        raise InputError(f"--P must be an integer from 1 to the context length {int_text(block_size)} "
                         f"(--context); got {P!r}.") from None  # fmt: skip
    return {"P": P_int, "pool_offset": pool_offset, "device": device, "batch_size": batch_size, "block_size": block_size,
            "compile": use_compile, "threads": threads}  # fmt: skip


def _corpus_tag(spec: str) -> str:
    """The corpus's kind in a default folder name: me, random, text (no `:`, `=` or `,`)."""
    return spec.split(":")[0]


def _offset_tag(pool_offset: int) -> str:
    """`-offsetO` in a default folder name where the pooling grid is moved, else nothing (so a
    shifted-grid control does not meet the aligned runs' folder)."""
    return f"-offset{pool_offset}" if pool_offset else ""


def _default_run_folder(variant, corpus_spec, seed, pool_offset: int = 0) -> str:
    """train-network's default run folder, `runs/VARIANT-SPEC[-offsetO]-seedS`: the whole corpus
    spec, so that runs on different specs of one corpus kind (`me`, `me:tokens=20k`) keep apart;
    a text corpus is `text` (its path would make folders)."""
    spec = "text" if corpus_spec.startswith("text:") else corpus_spec
    return f"runs/{variant}-{spec}{_offset_tag(pool_offset)}-seed{seed}"


@click.command("train-network")
@click.option(
    "--variant",
    default="coupled",
    show_default=True,
    type=click.Choice(list(VARIANTS)),
)
@_train_options
@click.option("--seed", default=0, show_default=True, type=INTEGER)
@click.option(
    "--out",
    default=None,
    metavar="DIR",
    callback=path_given("folder"),
    help="Run folder [default: runs/VARIANT-CORPUS-seedS, CORPUS the corpus spec (text for a text "
         "file), -offsetO after it with --pool-offset O].",
)
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in --out.")
@click.option(
    "--checkpoint-every",
    "ckpt_interval",
    default=50,
    show_default=True,
    type=INTEGER,
    metavar="STEPS",
    help="Write DIR/ckpt.pt every STEPS steps (and at the end).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def train_network(
    variant,
    corpus_spec,
    tokens,
    P,
    pool_offset,
    device,
    batch_size,
    block_size,
    use_compile,
    threads,
    seed,
    out,
    resume,
    ckpt_interval,
    as_json,
):
    """Train the fast-slow network (AdamW, warm-up and cosine decay, clipping, bf16 on CUDA).

    Logs loss, learning rate, tokens/s and every layer's gate tanh(alpha) per step, and the
    validation loss every 50 steps, to DIR/train.nc; checkpoints atomically to DIR/ckpt.pt;
    writes DIR/summary.json. Under torchrun it trains with DDP.

    \b
    Examples:
      fastslow-sim train-network
      fastslow-sim train-network --variant dense --corpus text:input.txt --tokens 2M
    """
    from ..training import (
        LOOP_NOTE,
        TrainConfig,
        TrainingDivergedError,
        check_run_folder,
        parse_tokens,
        train,
    )

    n_tokens = parse_tokens(tokens)
    base = _base_config(P, pool_offset, device, batch_size, block_size, use_compile, threads)
    parents = out is None or in_runs(out)  # runs/ is made, as the default's; others must exist
    if out is None:
        out = _default_run_folder(variant, corpus_spec, seed, base["pool_offset"])
    if seed < 0:
        raise InputError(f"--seed must be a non-negative integer; got {seed}.")
    check_run_folder(out, resume)
    cfg = TrainConfig(variant=variant, corpus=corpus_spec, tokens=n_tokens, seed=seed, out=out,
                      resume=resume, progress=not as_json, ckpt_interval=ckpt_interval, **base)  # fmt: skip
    try:
        summary = train(cfg, names=OPTION_NAMES, parents=parents)
    except TrainingDivergedError as err:
        click.echo(f"Error: {err}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json_text(summary))
        return
    rate = summary["step_tokens_per_s"]  # None: no step ran (stopped before the first)
    click.echo(
        f"{variant} on {corpus_spec}: {plural(summary['tokens'], 'token', spec=',')} in "
        f"{plural(summary['steps'], 'step')}, "
        f"{summary['wall_time_s']:.1f} s, {summary['tokens_per_s']:,.0f} tokens/s over the "
        f"training loop's wall-clock ({LOOP_NOTE}); "
        + ("no training step" if rate is None else
           f"{rate:,.0f} tokens/s over the training steps' own {summary['step_time_s']:.1f} s")
    )  # fmt: skip
    val = (
        "not evaluated (stopped early)"
        if summary["val_loss"] is None
        else f"{summary['val_loss']:.4f}"
    )
    click.echo(
        f"train loss {summary['train_loss']:.4f}, validation loss {val} (every aligned window)"
    )
    ref = summary.get("reference_losses")
    if ref:
        click.echo(f"references: oracle {ref['oracle_loss']:.4f}, Bayes floor "
                   f"{ref['bayes_floor_loss']:.4f}, ignore-y {ref['ignore_y_loss']:.4f}")  # fmt: skip
    if variant == "dense":  # its gates() are zeros per layer, a placeholder: there is no gate
        click.echo("gates: none (the dense variant has no slow path)")
    else:
        gates = ", ".join(f"{g:+.4f}" if isinstance(g, float) else "channels"
                          for g in summary["gates"])  # fmt: skip
        click.echo(f"gates tanh(alpha) per layer: {gates}")
    click.echo(f"run folder  {out} (train.nc, summary.json, ckpt.pt)")


@click.command()
@_train_options
@click.option("--seeds", default=5, show_default=True, type=INTEGER, help="Seeds per arm.")
@click.option(
    "--arms",
    "--variants",
    "arms",
    show_default=True,
    default="dense,dense-matched,coupled,frozen-gate,frozen-slow",
    help="Comma-separated arms.",
)
@click.option(
    "--margin",
    default=0.01,
    show_default=True,
    type=NUMBER,
    help="Equivalence margin in nats/token for the verdicts.",
)
@click.option("--out", default=None, metavar="DIR", callback=path_given("folder"),
              help="Folder [default: runs/reproduce-CORPUS, -offsetO added with --pool-offset O].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option(
    "--workers",
    default=None,
    type=INTEGER,
    metavar="N",
    help="Run the arms x seeds grid on a local dask cluster of N processes (at most the CPUs "
    "this process may use); 0: here [default: 0].",
)
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Run the grid on the existing dask cluster at ADDRESS.")
@click.option("--retry-failed", is_flag=True,
              help="Train the runs that failed in an earlier call again (a re-run keeps them).")
def reproduce(
    corpus_spec,
    tokens,
    P,
    pool_offset,
    device,
    batch_size,
    block_size,
    use_compile,
    threads,
    seeds,
    arms,
    margin,
    out,
    as_json,
    workers,
    scheduler,
    retry_failed,
):
    """The ablation: every arm for every seed, each seed's arms on the same data order.

    \b
    Arms: dense; dense-matched (dense, deepened to coupled's parameter count within 1%);
    coupled (slow path and gate trained); frozen-gate (slow path computed, gate pinned at 0:
    the dense model plus wasted compute); frozen-slow (slow weights frozen at init, gate
    trained).

    Prints parameters, training FLOPs per token, validation loss per seed (every aligned
    validation window), gates and tokens/s over each run's training-loop wall-clock (sampled
    evaluations and checkpoints included; the final full validation pass is not) per arm;
    then paired per-seed differences with a t-based 95% interval (df = seeds - 1) and a
    verdict: "equivalent" when the interval lies within +-margin, "differs" when it excludes
    0, else "inconclusive". Saves DIR/ablation.nc,
    the sweep store DIR/sweep.zarr (the table is computed from it; a re-run skips the runs it
    has, failed ones too unless --retry-failed) and one run folder per (arm, seed).
    --workers/--scheduler run the grid on dask.

    \b
    Examples:
      fastslow-sim reproduce --corpus me
      fastslow-sim reproduce --corpus text:../shared/data/tinyshakespeare.txt --seeds 5
    """
    from ..training import ARMS, parse_tokens, trained_tokens
    from ..training import reproduce as run_reproduce
    from ..validation import comma_entries

    n_tokens = parse_tokens(tokens)
    arm_names = comma_entries(arms, "--arms", "arm names", "'dense, coupled'")
    bad = [v for v in arm_names if v not in ARMS]
    if bad or not arm_names or len(set(arm_names)) != len(arm_names):
        raise InputError(f"--arms must name distinct arms among {list(ARMS)}; got {arms!r}.")
    check_cluster_options(workers, scheduler)
    base = _base_config(P, pool_offset, device, batch_size, block_size, use_compile, threads)
    base["progress"] = not as_json
    parents = out is None or in_runs(out)  # runs/ is made, as the default's; others must exist
    out = out or f"runs/reproduce-{_corpus_tag(corpus_spec)}{_offset_tag(base['pool_offset'])}"
    log = (lambda *a: None) if as_json else click.echo
    from ..sweep import SweepError

    try:
        with solver_warnings():  # the sweep's (a cell file it cannot read) as one line
            table = run_reproduce(corpus_spec, n_tokens, seeds, arm_names, out, base,
                                  margin=margin, log=log, workers=workers or 0,
                                  scheduler=scheduler, names=OPTION_NAMES, parents=parents,
                                  retry_failed=retry_failed)  # fmt: skip
    except SweepError as err:
        click.echo(f"Error: {err}", err=True)
        sys.exit(1)
    if as_json:
        # "tokens": those each run trained (whole steps; a list where the runs disagree)
        click.echo(json_text({"corpus": corpus_spec, "tokens": trained_tokens(table),
                              "tokens_requested": n_tokens, "seeds": seeds, "P": base["P"],
                              "pool_offset": base["pool_offset"], **table,
                              "out": out}))  # fmt: skip
        return
    click.echo(_format_ablation(table, corpus_spec, n_tokens, seeds, base["pool_offset"]))
    click.echo(f"dataset     {Path(out) / 'ablation.nc'}")


def _tokens_text(table, requested) -> str:
    """The header's tokens: those each run trained (whole steps), and the requested ones where
    they differ; the requested ones alone where the table does not hold the runs' tokens."""
    from ..training import trained_tokens

    trained = trained_tokens(table)
    if trained is None or trained == requested:
        return f"{requested:,} tokens per run"
    if isinstance(trained, list):
        return (f"the runs trained different tokens ({', '.join(f'{t:,}' for t in trained)}; "
                f"{requested:,} requested)")  # fmt: skip
    steps = {s for a in table["arms"].values() for s in a["steps"]}
    step = f": whole steps of {trained // steps.pop():,}" if len(steps) == 1 else ""
    return f"{trained:,} tokens per run ({requested:,} requested{step})"


def _format_ablation(table, corpus_spec, tokens, seeds, pool_offset: int = 0) -> str:
    """The ablation table as text; `tokens`: those requested per run."""
    grid = f", pooling grid from token {pool_offset} (--pool-offset)" if pool_offset else ""
    lines = [f"ablation on {corpus_spec}, {_tokens_text(table, tokens)}, {plural(seeds, 'seed')}"
             + grid,
             "| arm | layers | params | train FLOPs/token | val loss mean ± sd | |tanh(alpha)| per layer | tokens/s | wall / dense |",
             "|---|---:|---:|---:|---|---|---:|---:|"]  # fmt: skip
    one = "n/a (1 seed)" if seeds < 2 else None  # one seed has no spread and no interval
    for arm, r in table["arms"].items():
        v = np.array(r["val_loss"])
        sd = one or f"{v.std(ddof=1):.4f}"
        gates = (
            " ".join(f"{g:.4f}" for g in r["gate_abs_per_layer"])
            if arm not in ("dense", "dense-matched")
            else "-"
        )
        ratio = "-" if r["wall_ratio_to_dense"] is None else f"{r['wall_ratio_to_dense']:.3f}"
        lines.append(f"| {arm} | {r['n_layer']} | {r['params']:,} | {r['flops_per_token'] / 1e6:.2f} M | "
                     f"{v.mean():.4f} ± {sd} | {gates} | {r['tokens_per_s']:,.0f} | {ratio} |")  # fmt: skip
    lines.append("tokens/s and wall / dense: each run's throughput on this machine (sampled "
                 "evaluations and checkpoints included), not a cost comparison: the repository's "
                 "scripts/bench_network.py measures coupled/dense interleaved")  # fmt: skip
    ref = table.get("references")
    if ref:
        lines.append(f"references (same windows): oracle {ref['oracle_loss']:.4f}, Bayes floor "
                     f"{ref['bayes_floor_loss']:.4f}, ignore-y {ref['ignore_y_loss']:.4f}")  # fmt: skip
    m = table["margin"]
    if not table["comparisons"]:
        why = "one arm" if len(table["arms"]) == 1 else \
            "each arm is compared with dense, and coupled with dense-matched and frozen-slow"  # fmt: skip
        lines.append(f"paired differences: none ({why})")
        return "\n".join(lines)
    k = len(table["comparisons"])
    lines += [f"paired differences a - b over seeds (nats/token), t-based 95% interval, margin ±{m} "
              f"(equivalent: the interval inside ±{m}, two one-sided tests at 2.5%; "
              f"{plural(k, 'comparison')}, not adjusted for multiplicity):",
              "| a - b | mean | 95% interval | df | verdict |", "|---|---:|---|---:|---|"]  # fmt: skip
    for c in table["comparisons"]:
        lo, hi = c["ci95"]
        interval = one or f"[{lo:+.4f}, {hi:+.4f}]"
        note = " (excludes 0)" if c["verdict"] == "equivalent" and c["excludes_zero"] else ""
        if c["df"] > 0 and lo == hi == c["mean_diff"] == 0:  # frozen-gate vs dense: by design
            note = " (identical in every seed)"
        lines.append(f"| {c['a']} - {c['b']} | {c['mean_diff']:+.4f} | {interval} | "
                     f"{c['df']} | {c['verdict']}{note} |")  # fmt: skip
    return "\n".join(lines)


@click.command("phi-vs-pst")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(), metavar="RUN_DIR...",
                callback=path_given("run folder"))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per run.")
def phi_vs_pst_cmd(run_dirs, as_json):
    """How close each run's phi_theta is to p_st(y) on the me corpus: mean total-variation
    distance (± standard error across validation windows) to p_st(y_b) of the block being
    predicted, through the model's own next-token distribution late in the block (where the
    chain has mixed; every arm) and through a probe on the last layer's gated slow state
    (slow-path arms with an open gate), with its control, the same probe on the slow state of
    the network as initialised (the run's seed, no step), beside the baselines (the Bayes
    filter read out the same two ways, the previous block's histogram, corpus frequencies,
    uniform). Finished runs of one arm and setting with other seeds (reproduce's) are
    summarised below the table (not with --json): each distance's mean ± s.d. over the runs,
    and the probe minus its controls and the head minus the Bayes filter's head readout,
    paired by run with a 95% t interval (df = runs - 1; over seeds only: one corpus, one set
    of validation windows, the controls without a network fixed numbers). Writes
    RUN_DIR/phi_vs_pst.json.

    \b
    Examples:
      fastslow-sim phi-vs-pst runs/reproduce-me/coupled-seed0 runs/reproduce-me/dense-matched-seed0
      fastslow-sim phi-vs-pst runs/reproduce-me/coupled-seed*
    """
    from ..probe import READOUTS, check_run, phi_vs_pst, save_result

    first = {}  # a folder given twice (`r1 r1`, `r1 ./r1`) is computed, shown and written once
    for d in run_dirs:
        key = Path(d).resolve()
        if key in first:
            click.echo(f"note: {d} is the run folder {first[key]} again; it is computed once.",
                       err=True)  # fmt: skip
        else:
            first[key] = d
    run_dirs = list(first.values())
    # every folder checked before any work, and any result written
    checked = [check_run(d) for d in run_dirs]
    results = [phi_vs_pst(d, write=False, checked=c) for d, c in zip(run_dirs, checked)]
    for d, r in zip(run_dirs, results):
        save_result(d, r)
    if as_json:
        for r in results:
            click.echo(json_text({k: v for k, v in r.items() if k != "binned"}))
        return
    cols = [c for c in READOUTS if c != "y known"]
    click.echo("mean TV distance to p_st(y_b) ± s.e. (validation blocks; y known: 0)")
    click.echo("| run | arm | tokens | P | " + " | ".join(cols) + " |")
    click.echo("|---|---|---:|---:|" + "---:|" * len(cols))
    for r in results:
        cells = [_mean_se(r["tv"][c]) if c in r["tv"] else "-" for c in cols]
        tokens = f"{r['tokens']:,}" + ("" if r["finished"] else " (stopped early)")
        click.echo(f"| {r['run']} | {r['arm']} | {tokens} | {r['P']} | " + " | ".join(cells) + " |")
    _echo_over_runs(results, cols)
    for r in results:
        if not r["finished"]:
            click.echo(f"note: run {r['run']} stopped early: its checkpoint holds "
                       f"{r['steps']:,} of {plural(r['steps_planned'], 'step', spec=',')} "
                       f"({r['tokens']:,} of {r['tokens_planned']:,} tokens trained).")  # fmt: skip


# the network's readouts against their controls, paired by run: the probe against the same
# probe on the untrained network and on the raw histograms of the past blocks, the head
# against the Bayes filter read out the same way
_PAIRED_READOUTS = (("slow-state probe", "slow-state probe, untrained network"),
                    ("slow-state probe", "probe on the past blocks' histograms"),
                    ("model head", "Bayes filter, head readout"))  # fmt: skip


def _echo_over_runs(results: list, cols: list):
    """For each arm given as two or more finished runs of one setting (corpus, tokens, steps,
    P, validation windows) but other seeds: each readout's mean and standard deviation over
    the runs, and the network's readouts minus their controls, paired by run, with a t
    interval (df = runs - 1). A stopped run is left out; a seed given twice leaves its group
    out (a note says so)."""
    from ..training import paired_comparison

    found = {}
    for r in results:
        if r["finished"]:
            key = (r["arm"], r["corpus"], r["tokens"], r["steps"], r["P"], r["windows"])
            found.setdefault(key, []).append(r)
    groups = {}
    for (arm, corpus, tokens, *rest), g in found.items():
        seeds = [r["seed"] for r in g]
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        if twice:
            click.echo(f"note: {arm} ({corpus}, {tokens:,} tokens) has seed "
                       f"{', '.join(map(str, twice))} more than once; its runs are not "
                       f"summarised over seeds.", err=True)  # fmt: skip
        elif len(g) > 1:
            groups[(arm, corpus, tokens, *rest)] = sorted(g, key=lambda r: r["seed"])
    if not groups:
        return
    click.echo("\nover the runs of one arm and setting, other seeds: mean ± s.d. across runs")
    click.echo("| arm | runs (seeds) | " + " | ".join(cols) + " |")
    click.echo("|---|---|" + "---:|" * len(cols))
    for (arm, *_), g in groups.items():
        cells = []
        for c in cols:
            v = np.array([r["tv"][c]["mean"] for r in g if c in r["tv"]])
            ok = len(v) == len(g) and np.isfinite(v).all()
            cells.append(f"{v.mean():.4f} ± {v.std(ddof=1):.4f}" if ok else "-")
        seeds = ", ".join(str(r["seed"]) for r in g)
        click.echo(f"| {arm} | {len(g)} ({seeds}) | " + " | ".join(cells) + " |")
    for (arm, corpus, tokens, _, P, _), g in groups.items():
        pairs = [(a, b) for a, b in _PAIRED_READOUTS if any(a in r["tv"] for r in g)]
        if pairs:
            click.echo(f"{arm} ({corpus}, {tokens:,} tokens, P = {P}), paired by run, 95% t "
                       f"interval, df {len(g) - 1}:")  # fmt: skip
        for a, b in pairs:
            if not all(a in r["tv"] and b in r["tv"] for r in g):
                click.echo(f"  {a} - {b}: - (not every run has both)")
                continue
            cmp = paired_comparison([r["tv"][a]["mean"] for r in g], [r["tv"][b]["mean"] for r in g])
            lo, hi = cmp["ci95"]
            click.echo(f"  {a} - {b}: {cmp['mean_diff']:+.4f} [{lo:+.4f}, {hi:+.4f}]")


def _mean_se(tv: dict) -> str:
    """`mean ± se`, with `n/a` for a standard error that one window cannot give."""
    se = "n/a" if tv["se"] is None or not np.isfinite(tv["se"]) else f"{tv['se']:.4f}"
    return f"{tv['mean']:.4f} ± {se}"


COMMANDS = [corpus, train_network, reproduce, phi_vs_pst_cmd]
