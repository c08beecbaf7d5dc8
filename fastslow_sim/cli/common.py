"""What the commands share: option groups, parsing of option strings into numbers with
one-sentence errors, output paths, and the summary printing."""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import warnings
from pathlib import Path

import click
import numpy as np

from ..errors import InputError
from ..integrators import METHODS
from ..systems import SYSTEMS

DEFAULT_RESULTS = Path("fastslow-results")
RUNS = Path("runs")  # the network commands' and sweeps' own folder


def in_runs(path) -> bool:
    """Whether `path` lies directly in `runs/`, the commands' own folder, which they make as
    needed (any other missing folder above an output is the user's to make, and refused)."""
    return Path(path).parent == RUNS


def path_given(what: str):
    """A click callback for a path option or argument: `InputError` for an empty string, which
    named the current folder (`--out ""` trained into it) or let a default stand in for it
    (`reproduce --out ""` wrote to runs/reproduce-me), never what was typed; and for an
    option's value that starts with '-': click gives an option the next word whatever it is,
    so `integrate --out --json` wrote a dataset called '--json' and printed text, not JSON."""

    def check(ctx, param, value):
        values = value if isinstance(value, tuple) else (value,)
        if any(v is not None and str(v) == "" for v in values):
            raise InputError(f"{param_name(param)} must name a {what}; got an empty string.")
        dashed = [str(v) for v in values if v is not None and str(v).startswith("-")]
        if dashed and param.param_type_name == "option":
            raise InputError(
                f"{param_name(param)} takes a {what} name; got {dashed[0]!r}, which looks like "
                f"an option (a name that starts with '-' is given as ./{dashed[0]})."
            )
        return value

    return check


def param_name(param) -> str:
    """How a message calls a click option (`--out/--out-dir`) or argument (`RUN_DIR`)."""
    if param.param_type_name == "option":
        return "/".join(param.opts)
    return param.metavar.rstrip(".")


class Integer(click.ParamType):
    """click's INT with the rule of every integer the commands read (`--P`, `--max-steps`, the
    sweep's values): digits or a whole number in any decimal form (1e3, 2.0), exactly
    (`validation.as_int`; click INT refused 1e3), and no underscores (int() read "1_5" as 15):
    one sentence naming the option, exit status 2. Other text keeps click's usage error."""

    name = "integer"

    def convert(self, value, param, ctx):
        from ..validation import as_int, no_underscore

        if isinstance(value, int) and not isinstance(value, bool):  # a default
            return value
        no_underscore(param_name(param), value)
        text = str(value).strip()
        if len(text) > 4300:  # int() reads no more digits; not echoed whole
            self.fail(f"'{text[:12]}...' ({len(text):,} characters) is not an integer of at most "
                      f"4,300 digits", param, ctx)  # fmt: skip
        try:  # digits of any size, as click INT read them: the option's bound says more
            return as_int(value)
        except ValueError:
            self.fail(f"{value!r} is not a valid integer", param, ctx)
        except OverflowError:  # 1e999999 would be a million digits
            self.fail(f"{value!r} is not a valid integer below 1e19 in absolute value", param, ctx)


class Number(click.ParamType):
    """click's FLOAT without underscores (float() read "1_5" as 15): one sentence naming the
    option, exit status 2, as `Integer`."""

    name = "float"

    def convert(self, value, param, ctx):
        from ..validation import no_underscore

        if isinstance(value, (int, float)) and not isinstance(value, bool):  # a default
            return float(value)
        no_underscore(param_name(param), value)
        try:
            v = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a valid float", param, ctx)
        if math.isinf(v) and "inf" not in str(value).lower():  # 1e999: the message said "got inf"
            self.fail(f"{value!r} is beyond the range of a float (magnitude at most about 1.8e308)", param, ctx)
        return v


INTEGER, NUMBER = Integer(), Number()


MAX_N_EVAL = 1_000_000  # saved time points
MAX_BATCH = 1_000_000  # trajectories of --batch
RTOL_MIN = 100 * 2.0**-52
KAPPA_MAX = 30.0  # |kappa|: beyond, exp(kappa c.x) defeats the continuation of the branches


class Group(click.Group):
    """Turns `InputError` from any command into one sentence and exit status 2, Ctrl-C
    (`KeyboardInterrupt`) into "Interrupted." and exit status 130 (the dask worker processes of
    `--workers` ignore SIGINT and are shut down by this one: `sweep._started_cluster`), and a
    standard output that cannot take the output (`> /dev/full`, a closed pipe; `--help` and
    `--version` included) or a file operation that fails (a full disk) into one sentence and
    exit status 1, not a traceback."""

    def main(self, *args, **kwargs):
        for stream in (sys.stdout, sys.stderr):
            # a file name that is not UTF-8 (Linux names are bytes) reaches the summary as
            # surrogates, which a strict stream refused after the files were written ('the
            # computation failed (UnicodeEncodeError)', exit 1): they are printed escaped
            if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="backslashreplace")
        try:
            return super().main(*args, **kwargs)
        except OSError as err:
            if not _raised_writing_stdout(err):
                # a file the command writes or reads failed after the checks (a full disk, a
                # rename the file system refuses): one sentence, exit status 1
                name = err.filename2 or err.filename
                where = f" on {str(name)!r}" if name else ""
                click.echo(f"Error: a file operation failed{where}: "
                           f"{err.strerror or type(err).__name__}.", err=True)  # fmt: skip
                sys.exit(1)
            # the output written so far is lost; so is what Python would flush again at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            if not isinstance(err, BrokenPipeError):  # a closed pipe: its reader chose to stop
                click.echo(f"Error: standard output cannot take the printed output "
                           f"({err.strerror}).", err=True)  # fmt: skip
            sys.exit(1)

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as err:  # `fastslow-sim --bad-option`
            _usage_error(err, info_name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InputError as err:
            click.echo(f"Error: {err}", err=True)
            ctx.exit(2)
        except click.UsageError as err:  # an unknown command, option or unparsable value
            sub = ctx.invoked_subcommand  # set once the command is known
            _usage_error(err, f"{ctx.command_path} {sub}" if sub else ctx.command_path)
        except KeyboardInterrupt:  # Ctrl-C: not click's "Aborted!" and status 1 (a failed
            # run's status) but 128 + SIGINT, as a shell reports a command that SIGINT ended; on
            # a terminal the line starts below the echoed ^C
            click.echo(("\n" if sys.stderr.isatty() else "") + "Interrupted.", err=True)
            ctx.exit(130)


def _usage_error(err: click.UsageError, command: str):
    """click's usage error as one line and exit status 2: its sentence, then where help is
    (click prints the usage line, a hint and a blank line before it). A bare `fastslow-sim`
    is no error: its help, as click prints it."""
    if isinstance(err, click.exceptions.NoArgsIsHelpError):
        err.show()
        sys.exit(err.exit_code)
    text = err.format_message().strip()
    text = re.sub(r"\.? \(?Did you mean (.*?)\)?$", r" (did you mean \1)", text).rstrip(".")
    where = err.ctx.command_path if err.ctx is not None else command
    click.echo(f"Error: {text}; see '{where} --help'.", err=True)
    sys.exit(err.exit_code)


def _raised_writing_stdout(err: OSError) -> bool:
    """True when `err` was raised by `click.echo` writing to standard output (file descriptor 1),
    not by a file the command writes."""
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "echo" and frame.f_globals.get("__name__") == "click.utils":
            try:
                return frame.f_locals.get("file").fileno() == 1
            except (AttributeError, OSError, ValueError):
                return False
        tb = tb.tb_next
    return False


def json_text(obj) -> str:
    """Strict JSON (RFC 8259 has no NaN or Infinity): non-finite numbers become null."""
    from ..io import strict_json

    return strict_json(obj)


def parse_eps_P(eps: str | None, P: str | None):
    """`(eps, P)` from the raw option strings, with one-sentence errors."""
    from ..systems import resolve_eps
    from ..validation import as_int, no_underscore

    no_underscore("--P", P)
    no_underscore("--eps", eps)
    if P is not None:
        text = P
        try:  # exactly, 8.0 and 1e3 too: through float, 9007199254740993.0 ran as 2**53
            P = as_int(text)
        except ValueError:
            raise InputError(f"--P must be a positive integer (P = 1/eps); got {text!r}.") from None
        except OverflowError:  # 1e19 or more: beyond every method's bound, never expanded
            raise InputError(f"--P must be a positive integer below 1e19 (eps = 1/P >= 1e-19); "
                             f"got {text!r}.") from None  # fmt: skip
    if eps is not None:
        try:
            eps = float(eps)
        except ValueError:
            raise InputError(f"--eps must be a positive finite number; got {eps!r}.") from None
    return resolve_eps(eps, P)


def parse_vector(text: str, name: str) -> np.ndarray:
    from ..validation import number_list

    values = np.array(number_list(text, name), dtype=np.float64)
    if values.size == 0:
        raise InputError(f"{name} must hold at least one number; got {text!r}.")
    return values


def system_option(help_text: str):
    """The `--system` option (a named system, `birth-death` by default)."""
    return click.option("--system", "system_name", default="birth-death", show_default=True,
                        type=click.Choice(list(SYSTEMS)), help=help_text)  # fmt: skip


def output_options(default_name: str):
    """The `--out`, `--plot`, `--no-plot` and `--json` options shared by the computing commands."""

    def decorate(f):
        options = [
            click.option("--out", default=None, metavar="FILE.nc", callback=path_given("file"),
                         help=f"NetCDF output [default: fastslow-results/{default_name}]."),
            click.option("--plot", "plot_path", default=None, metavar="FILE.png",
                         callback=path_given("file"),
                         help="Plot output [default: the --out path with .png]."),
            click.option("--no-plot", is_flag=True, help="Do not write a plot."),
            click.option("--json", "as_json", is_flag=True,
                         help="Print one JSON object instead of text."),
        ]  # fmt: skip
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def use_agg():
    """Select matplotlib's non-interactive Agg backend: the CLI only writes figures to files
    (the analysis layer itself picks no backend, so that it also draws in notebooks)."""
    import matplotlib

    matplotlib.use("Agg")


def _check_plot_format(plot_path: Path):
    """`InputError` unless matplotlib can write `plot_path`'s format here."""
    from ..analysis.plots import check_figure_format

    check_figure_format(plot_path, "plot path")


def name_number(value: float) -> str:
    """`value` as a default output name writes it: `:g` where that gives it back exactly
    (0.125, 1e-04 as 0.0001, 1e-20), else the shortest text that does (`repr`): `:g` kept six
    digits, so eps 0.12345671 and 0.12345672 both wrote ...-eps0.123457.nc, the second run
    replacing the first."""
    short = f"{value:g}"
    return short if float(short) == float(value) else repr(float(value))


def output_paths(stem: str, out, plot_path, no_plot: bool):
    """Dataset and plot paths, checked before any work: defaults go to ./fastslow-results/."""
    from ..io import check_writable

    if plot_path is not None and no_plot:
        raise InputError(
            f"--plot {plot_path} asks for a plot and --no-plot for none; expected one of them."
        )
    target = out if out is not None else DEFAULT_RESULTS / f"{stem}.nc"
    clash = plot_path is not None and os.path.realpath(plot_path) == os.path.realpath(target)
    if plot_path is not None and not no_plot and not clash:  # before the default folder is made
        _check_plot_format(Path(plot_path))
        check_writable(plot_path, "plot")
    if out is None:
        from ..validation import folder

        folder(DEFAULT_RESULTS, "default output folder").mkdir(parents=True, exist_ok=True)
        out = DEFAULT_RESULTS / f"{stem}.nc"
    out = check_writable(out, "dataset")
    if no_plot:
        return out, None
    plot_path = out.with_suffix(".png") if plot_path is None else plot_path
    plot_path = check_writable(plot_path, "plot")
    if os.path.realpath(plot_path) == os.path.realpath(out):
        raise InputError(
            f"the plot path {str(plot_path)!r} is also the dataset path, so the plot would "
            f"replace the dataset; expected another --plot FILE.png (or --no-plot)."
        )
    _check_plot_format(plot_path)
    return out, plot_path


def parse_eps_list(text: str) -> list[float]:
    values = parse_vector(text, "--eps")
    if np.any(~np.isfinite(values)) or np.any(values <= 0):
        raise InputError(f"--eps values must be positive finite numbers; got {text!r}.")
    if values.size < 2:
        raise InputError(f"--eps needs at least two values to fit a slope; got {text!r}.")
    repeated = sorted({float(v) for v in values if np.count_nonzero(values == v) > 1})
    if repeated:
        raise InputError(
            f"--eps values must be distinct to fit a slope; {fmt_vec(repeated)} repeated in "
            f"{text!r}."
        )
    # the slopes are fitted against log(eps): two values a float64 step apart have one logarithm,
    # and the fit's x-axis degenerates (0.01,0.010000000000000002 printed slopes 0.948, 1.513)
    logs = np.log(values)
    same = sorted({float(v) for v, lv in zip(values, logs) if np.count_nonzero(logs == lv) > 1})
    if same:
        raise InputError(
            f"--eps values {', '.join(map(repr, same))} in {text!r} have the same logarithm in float64, and the "
            f"slopes are fitted against log(eps); expected values further apart."
        )
    return values.tolist()


def check_cluster_options(workers, scheduler) -> None:
    """`InputError` when both `--workers` (a local cluster) and `--scheduler` (an existing one)
    are given: the grid runs on one cluster."""
    if workers is not None and scheduler is not None:
        raise InputError(
            "give --workers (a local cluster) or --scheduler (an existing one), not both."
        )


# numpy's floating-point warnings: the run's status and its non-finite checks say what came of them
_FLOATING_POINT = re.compile(r"(overflow|underflow|invalid value|divide by zero) encountered")


@contextlib.contextmanager
def solver_warnings():
    """Every warning of a command as one line on stderr, `Warning: ...`, as it is issued (a
    stiffness warning before the solve), each text once per command (a gallery that runs many
    solves says a repeated warning once); never Python's form with a file name and a source
    line. numpy's floating-point warnings (overflow, invalid value, ...) are not shown: the
    status of the run, or its error, says what they led to."""
    from ..integrators import IgnoredOptionWarning, MassDriftWarning, StiffnessWarning

    said = set()
    with warnings.catch_warnings():
        for kind in (StiffnessWarning, IgnoredOptionWarning, MassDriftWarning):
            warnings.simplefilter("always", kind)

        def show(message, category, filename, lineno, file=None, line=None):
            text = " ".join(str(message).split())
            if issubclass(category, RuntimeWarning) and _FLOATING_POINT.match(text):
                return
            if text not in said:
                said.add(text)
                click.echo(f"Warning: {text}", err=True)

        warnings.showwarning = show
        yield


def ode_command(f):
    """A solver or analysis failure (overflow, a stalled continuation, a singular matrix) ends in
    one sentence and exit status 1, never a traceback; bad input stays exit status 2. The
    solvers' warnings are one line each (`solver_warnings`)."""
    import functools

    from ..solvers import SOLVER_ERRORS

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            with solver_warnings():
                return f(*args, **kwargs)
        except InputError:
            raise
        except SOLVER_ERRORS as err:
            text = " ".join(str(err).split()) or type(err).__name__
            click.echo(f"Error: the computation failed ({type(err).__name__}): {text}", err=True)
            sys.exit(1)

    return wrapper


def unsigned_zero(value: float, spec: str) -> str:
    """`value` in the format `spec`, without a sign where it rounds to zero there: a mean of
    -2e-20 printed as "-0.000", or -0.0 as "-0" (every number of a manifold line and every
    entry of `fmt_vec` goes through it)."""
    text = format(value, spec)
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def range_text(a: float, b: float, spec: str = "g") -> str:
    """`[a, b]` in `spec`, with more significant digits where `spec` would print two different
    ends alike: a range 1e-13 wide at y = 0.1 is `[0.1, 0.1000000000001]`, not `[0.1, 0.1]`."""
    lo, hi = unsigned_zero(a, spec), unsigned_zero(b, spec)
    digits = 6
    while a != b and lo == hi and digits < 17:
        digits += 1
        lo, hi = unsigned_zero(a, f".{digits}g"), unsigned_zero(b, f".{digits}g")
    return f"[{lo}, {hi}]"


def fmt_vec(v, digits=4, edge=8):
    """`[a, b, ...]` with `digits` significant digits; over `2 edge` entries, the first `edge`
    and the last 2, and how many there are (a 4,096-state vector is not a summary)."""
    a = np.ravel(v)

    def text(part):
        return ", ".join(unsigned_zero(float(e), f".{digits}g") for e in part)

    if a.size <= 2 * edge:
        return f"[{text(a)}]"
    return f"[{text(a[:edge])}, ..., {text(a[-2:])}] ({a.size:,} entries)"


def systems_help():
    return "; ".join(f"{k}: {d}" for k, (_, d) in SYSTEMS.items())


def methods_help():
    return "; ".join(f"{k}: {m.description}" for k, m in METHODS.items())


def echo_summary(summary: dict, as_json: bool, lines) -> None:
    """Print a command's result: one JSON object with `--json`, else the text `lines`
    (a list of strings, or a function of the summary giving them)."""
    if as_json:
        click.echo(json_text(summary))
        return
    for line in lines(summary) if callable(lines) else lines:
        click.echo(line)


def exit_on_failure(status: str) -> None:
    """Exit status 1 when a computation reports failure (its output is already written)."""
    if status != "success":
        sys.exit(1)
