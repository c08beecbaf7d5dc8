"""Every teaching example in scripts/examples/ runs in the test suite (issue 16, item 3), drawing
into Axes it is given (as in a notebook), and a number it returns is checked against theory."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # this test process only
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "scripts" / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_gth(out):
    for r, errs in out["errors"].items():
        # GTH: relative error O(n u) per entry, whatever the conditioning (O'Cinneide 1993),
        # against an exact reference: measured 4.5e-16 and 9.3e-16 at n = 40 (u = 1.1e-16);
        # 1e-14 is 10x that (the old reference, exp(i log r), was itself 1.6e-14 off)
        assert errs["GTH"] < 1e-14, (r, errs)
        # the eigenvector's absolute error ~ u * max p = 1e-16 is 1e23 times p_min = 1e-39
        assert errs["eigenvector"] > 1.0, (r, errs)
    assert out["errors"][0.1]["LU (row replaced)"] > 1.0  # the tail 1e-39 is lost to round-off


def check_collapse(out):
    # x - h0 = eps h1 + O(eps^2): the ratio of the two is 1 + O(eps) (measured 0.55 eps)
    for eps, ratio in out["ratio"].items():
        if eps <= 0.03:
            assert abs(ratio - 1.0) < eps, (eps, ratio)


def check_first_order(out):
    s = out["slopes"]
    # theory 1, 2, 1; birth-death's next order is large (|x - h0| ~ eps |h1| (1 + 19 eps)), and
    # every eps is measured on one window, after the largest eps's layer: on 0.01 ... 0.0025 the
    # fit gives 1.11, 2.17, 1.01 (on 0.04 ... 0.01 it gave 1.40), so 0.25 around the slope
    assert abs(s["err_h0"] - 1.0) < 0.25 and abs(s["err_h1"] - 2.0) < 0.3
    assert abs(s["err_y"] - 1.0) < 0.25


def check_multirate(out):
    assert out["tokens"] == out["slow_updates"] * 8  # one slow update per P = 8 tokens
    assert out["mass_error"] < 1e-13  # exact propagator: probability conserved to round-off
    # first order in H: halving H halves the error, log2 ratio 1 (measured 0.93)
    assert abs(out["order"] - 1.0) < 0.15


def check_tiny_gate(out):
    g = out["gates"]
    assert (g[0] == 0).all()  # zero-initialised alpha: the network starts as the dense one
    assert g[-1].min() > 1e-3  # the gate has opened (measured 0.018 per layer)
    # AdamW steps by about lr_t (measured 0.94-1.16 lr_t a step), so the gate is bounded by
    # tanh(sum lr) with room for that ratio: the docstring's reading of the curve
    assert (g[-1] <= 1.2 * out["lr_reach"][-1]).all(), (g[-1], out["lr_reach"][-1])
    assert out["val_loss"] < out["uniform_loss"]  # it learnt something: below ln V


CHECKS = {"gth_birth_death": check_gth, "manifold_collapse": check_collapse,
          "first_order_correction": check_first_order, "multirate_skeleton": check_multirate,
          "tiny_gate": check_tiny_gate}  # fmt: skip


def test_every_example_is_checked():
    assert {p.stem for p in EXAMPLES.glob("*.py")} == set(CHECKS)
    assert len(CHECKS) >= 5


@pytest.mark.parametrize("name", sorted(CHECKS))
@pytest.mark.slow
def test_example_draws_into_given_axes_and_matches_theory(name):
    module = _load(name)
    n_axes = 1 if name in ("first_order_correction", "tiny_gate") else 2
    fig, axes = plt.subplots(1, n_axes)
    try:
        before = plt.get_fignums()
        out = module.main(ax=axes)
        assert out["figure"] is fig and plt.get_fignums() == before  # no figure of its own
        assert all(a.has_data() for a in fig.axes)
        CHECKS[name](out)
    finally:
        plt.close("all")


def _script(name, *args, cwd):
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_example_runs_as_a_script_and_saves_its_png(name, tmp_path):
    # by default under the git-ignored fastslow-results/, not in the current folder (the
    # repository's root, run as the docstrings show)
    res = _script(name, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "fastslow-results" / "examples" / f"{name}.png").stat().st_size > 10_000
    assert res.stdout.endswith(f"saved fastslow-results/examples/{name}.png\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fastslow-results"]


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_an_example_saves_its_figure_under_fastslow_results_or_at_out(tmp_path):
    """The scripts wrote `<name>.png` into the current folder, the repository's root when run
    as their docstrings show, where git does not ignore it (one quick example, all the others
    take the same path through `script_arguments`)."""
    res = _script("gth_birth_death", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    png = tmp_path / "fastslow-results" / "examples" / "gth_birth_death.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = res.stdout.splitlines()  # the table as before, then where the figure went
    assert lines[0] == "birth-death chain, 40 states: largest relative error against the closed form"
    assert lines[-1] == "saved fastslow-results/examples/gth_birth_death.png" and len(lines) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fastslow-results"]
    res = _script("gth_birth_death", "--out", "mine.pdf", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "mine.pdf").read_bytes()[:5] == b"%PDF-"
    assert res.stdout.splitlines()[-1] == "saved mine.pdf"


def _one_in_default(names, keep="gth_birth_death"):
    """`names` as parameters, all but `keep` marked slow: the scripts share `script_arguments`,
    so the default suite runs one (a subprocess each, 3-7 s) and `-m slow` the others."""
    return [n if n == keep else pytest.param(n, marks=pytest.mark.slow) for n in names]


@pytest.mark.parametrize("name", _one_in_default(sorted(CHECKS)))
def test_example_help_prints_its_usage_and_does_nothing_else(name, tmp_path):
    """`--help` (and any other argument) was ignored: the script ran whole (tiny_gate trained a
    network) and wrote its PNG."""
    res = _script(name, "--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: python scripts/examples/{name}.py [-h] [--out PATH]\n")
    first = _load(name).__doc__.splitlines()[0]
    assert f"\n{first}\n" in res.stdout and "--out PATH" in res.stdout
    # (argparse wraps the help text at the terminal's width, also at a hyphen)
    assert f"[default:fastslow-results/examples/{name}.png]" in "".join(res.stdout.split())
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the folder
    res = _script(name, "--bogus", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.endswith("error: unrecognized arguments: --bogus\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["default", pytest.param("--out", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_example_keeps_a_users_file_of_its_pngs_name(name, where, tmp_path):
    """Run as a script, each example wrote its PNG with a plain savefig into the current folder,
    replacing a file of the user's of that name (their own plot, say). It is refused before the
    work, in one sentence, with exit status 2 (the CLI's for a refused input), and the file is
    kept byte for byte: at the default path and at one given with --out."""
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    shown = f"fastslow-results/examples/{name}.png" if where == "default" else "mine.png"
    mine = tmp_path / shown
    mine.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(mine)  # a PNG of the user's: matplotlib's, without fastslow-sim's mark
    plt.close(fig)
    before = mine.read_bytes()
    res = _script(name, *(["--out", shown] if where == "--out" else []), cwd=tmp_path)
    assert res.returncode == 2, res.stdout
    assert res.stderr == (f"Error: the figure path '{shown}' holds a file that fastslow-sim "
                          f"did not write; it is never replaced: remove it or choose another "
                          f"path.\n")  # fmt: skip
    assert res.stdout == ""  # refused before the work
    assert mine.read_bytes() == before
    assert sorted(p.name for p in mine.parent.iterdir()) == [mine.name]  # no temporary file


@pytest.mark.parametrize("out, line", [
    ("gate.txt", "Error: the figure path 'gate.txt' asks for format 'txt', which matplotlib cannot "
                 "write; expected a suffix among "),
    ("newdir/", "Error: the figure path 'newdir/' names a folder; expected a file name such as "
                "newdir/figure.png.\n"),
])  # fmt: skip
def test_an_example_refuses_a_figure_path_it_cannot_write_before_its_work(out, line, tmp_path):
    """--out gate.txt trained tiny_gate's network, then ended in matplotlib's ValueError
    traceback (exit 1); --out newdir/ wrote a PNG file named newdir."""
    res = _script("gth_birth_death", "--out", out, cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""  # refused before the work
    assert res.stderr.startswith(line) and len(res.stderr.splitlines()) == 1, res.stderr
    assert list(tmp_path.iterdir()) == []
