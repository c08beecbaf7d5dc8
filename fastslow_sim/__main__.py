"""`python -m fastslow_sim` is the `fastslow-sim` command; `run` is its console entry point."""

import sys


def run():
    """The `fastslow-sim` command. The command line (and with it numba, xarray and torch) is
    imported here, not when this module is: a Ctrl-C during that second of loading ends as one
    during a command does, in "Interrupted." and exit status 130, not in a traceback."""
    try:
        from .cli import main
    except KeyboardInterrupt:
        sys.stderr.write(("\n" if sys.stderr.isatty() else "") + "Interrupted.\n")
        raise SystemExit(130) from None
    main(prog_name="fastslow-sim")


if __name__ == "__main__":
    run()
