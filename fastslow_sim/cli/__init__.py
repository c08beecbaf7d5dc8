"""The `fastslow-sim` command line: a thin layer that parses, validates, calls the library,
prints and saves (DESIGN 5), one module per group of commands (`ode`, `network`, `figures`,
`sweep`).

Bad input ends in one sentence on stderr and exit status 2; a solver failure in exit status 1;
Ctrl-C in "Interrupted." and exit status 130, while the command loads too (the console entry
point is `fastslow_sim.__main__.run`, which imports this module; only one in the hundredths of a
second while Python itself starts ends in Python's own traceback). The worker processes of
`--workers` ignore it and are shut down by this one; a Ctrl-C in the instant they are spawned is
lost.
"""

from __future__ import annotations

import click

from .._version import __version__
from . import figures, network, ode, sweep
from .common import Group


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fastslow-sim")
def main():
    """fastslow-sim: singularly perturbed fast-slow systems with eps = 1/P, master-equation
    generators and their stationary distributions.

    \b
    Start with:
      fastslow-sim integrate --eps 0.125
    which integrates the default 8-state birth-death system, prints a summary and writes a
    NetCDF dataset and a plot under ./fastslow-results/.

    Numbers: an integer option or value (--chunk-size, --P, --seed, --grid seed=0:1e3) takes
    digits or a whole number in any decimal form (1e3, 2.0); no number takes underscores (1_5
    is refused, not read as 15).
    """



for _module in (ode, network, figures, sweep):
    for _command in _module.COMMANDS:
        main.add_command(_command)

__all__ = ["main"]
