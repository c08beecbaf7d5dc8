"""`python -m fastslow_sim` is the `fastslow-sim` command."""

from .cli import main

main(prog_name="fastslow-sim")
