"""The figure commands: `figures` (every figure, from `fastslow_sim.gallery`) and its alias
`training-figures` (the training figures from saved runs, computing nothing)."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from .common import ode_command, path_given, use_agg


def _print_figure_records(records):
    """One line per figure: seconds, files, and the datasets behind it (reused or computed)."""
    for r in records:
        if "skipped" in r:
            click.echo(f"{r['name']:<22} skipped: {r['skipped']}")
            continue
        data = ", ".join(f"{p} ({how})" for p, how in r["datasets"])
        click.echo(f"{r['name']:<22} {r['seconds']:7.1f} s  {', '.join(r['files'])}")
        click.echo(f"{'':<22} data: {data}")
    click.echo(f"total {sum(r['seconds'] for r in records):.1f} s")


class _FiguresCommand(click.Command):
    """`figures --help` ends with the figure names, one line each on what it shows (read from
    the gallery when the help is asked for, not when the CLI starts)."""

    def format_epilog(self, ctx, formatter):
        from ..gallery import FIGURES, GROUPS

        with formatter.section(f"Figures (--only NAME,...; or a group: {', '.join(GROUPS)})"):
            formatter.write_dl([(name, f.shows) for name, f in FIGURES.items()])
        super().format_epilog(ctx, formatter)


@click.command(cls=_FiguresCommand)
@click.option("--quick", is_flag=True,
              help="Short runs (about 2 minutes on two cores) under fastslow-results/quick/.")
@click.option("--out", "--out-dir", "out_dir", default=None, type=click.Path(file_okay=False),
              callback=path_given("folder"),
              help="Folder for the figures [default: figures/; with --quick "
                   "fastslow-results/quick/figures/].")
@click.option("--results-dir", default=None, type=click.Path(file_okay=False),
              callback=path_given("folder"),
              help="Folder for the ODE and cost datasets [default: fastslow-results/, with "
                   "--quick fastslow-results/quick/].")
@click.option("--runs", "runs_dir", default=None, type=click.Path(file_okay=False),
              callback=path_given("folder"),
              help="Folder of the training runs [default: runs/; with --quick "
                   "fastslow-results/quick/runs/].")
@click.option("--text", default=None, metavar="PATH", callback=path_given("file"),
              help="Text corpus of the second ablation [default: ../shared/data/tinyshakespeare.txt; "
                   "left out where the file is missing].")
@click.option("--only", default=None, metavar="NAMES",
              help="Comma-separated figure names (listed below) or groups (ode, training, "
                   "cost).")
@ode_command
def figures(quick, out_dir, results_dir, runs_dir, text, only):
    """Regenerate every figure, ODE and training alike, as PNG and PDF.

    Each figure is drawn from a saved dataset; a missing one is computed first (a progress bar
    says what): the full default reads the finished runs in runs/ (fastslow-sim reproduce,
    scripts/phi_vs_pst_sweep.py) and trains what is missing (hours on a CPU); --quick trains
    small networks briefly. figures/README.md lists the figures. Recipes: fastslow_sim.gallery.

    \b
    Examples:
      fastslow-sim figures --quick
      fastslow-sim figures --only ode
    """
    use_agg()
    from ..gallery import DEFAULT_TEXT, make_figures, select, uses_text

    if text is not None and not Path(text).is_file():
        raise InputError(f"--text {text!r} is not a file; expected a text corpus.")
    if text is None and not Path(DEFAULT_TEXT).is_file() and uses_text(select(only)):
        click.echo(f"note: no {DEFAULT_TEXT} here, so the training figures show the me corpus only")
    records = make_figures(out=out_dir, quick=quick, results=results_dir, runs=runs_dir,
                           text=DEFAULT_TEXT if text is None else text, only=only)  # fmt: skip
    _print_figure_records(records)


@click.command("training-figures")
@click.option(
    "--runs",
    "runs_dir",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    callback=path_given("folder"),
    help="Folder holding reproduce-text/ and reproduce-me/ (from fastslow-sim reproduce).",
)
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(file_okay=False),
              callback=path_given("folder"))
@ode_command  # as `figures`: each warning one `Warning:` line
def training_figures(runs_dir, out_dir):
    """The training figures from the runs already saved (computes nothing): an alias of
    `fastslow-sim figures --only training` that skips a figure whose runs are missing.

    \b
    Make the runs first:
      fastslow-sim reproduce --corpus text:PATH --out runs/reproduce-text
      fastslow-sim reproduce --corpus me --out runs/reproduce-me
      fastslow-sim phi-vs-pst runs/reproduce-me/*-seed0
      python scripts/phi_vs_pst_sweep.py   # runs/phi-sweep: TV against tokens and P
    then draw them:
      fastslow-sim training-figures --runs runs --out-dir figures
    """
    use_agg()
    from ..gallery import make_figures

    records = make_figures(out=out_dir, runs=runs_dir, only="training", compute=False,
                           progress=False)  # fmt: skip
    if not any(r["files"] for r in records):
        raise InputError(
            f"no ablation results under {str(runs_dir)!r}; run fastslow-sim reproduce first."
        )
    _print_figure_records(records)


COMMANDS = [figures, training_figures]
