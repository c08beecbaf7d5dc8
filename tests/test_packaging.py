"""The package installs whole and starts fast (issue 14, item 3).

- every package under fastslow_sim/ is found by the build (no hand-kept list to forget one in);
- the version is the installed metadata's, written once in pyproject.toml;
- `import fastslow_sim` and the commands that need no network (`--help`, `integrate` with a
  scipy method, `convergence`, `manifold`, `mapping`) never import torch. Each runs in a fresh
  interpreter that records the import chain of the first `import torch`, so a failure names it;
- `import fastslow_sim` loads none of numba, scipy, xarray (its names, version and submodules
  are read lazily), and a Ctrl-C while the `fastslow-sim` command loads them ends in
  "Interrupted." and status 130.
"""

import json
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

import fastslow_sim

ROOT = Path(__file__).resolve().parents[1]

# Runs `code` in a fresh interpreter that notes where torch is first imported from, then prints
# {"torch": bool, "stack": [...]} as its last line.
_PROBE = """
import json, sys, traceback

class _Watch:
    stack = None

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and _Watch.stack is None:
            _Watch.stack = [f"{f.filename}:{f.lineno} {f.line}" for f in traceback.extract_stack()
                            if "importlib" not in f.filename][:-1]
        return None

sys.meta_path.insert(0, _Watch())
try:
    exec(compile(sys.argv[1], "<probe>", "exec"))
finally:
    print(json.dumps({"torch": "torch" in sys.modules, "stack": _Watch.stack}))
"""


def _torch_imported(code: str, cwd: Path) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, code], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _cli(args: list[str]) -> str:
    """Probe code that runs `fastslow-sim ARGS` in-process and fails unless it exits with 0."""
    return (
        "from fastslow_sim.cli import main\n"
        "try:\n"
        f"    main({args!r}, prog_name='fastslow-sim')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), f'exit status {e.code}'\n"
    )


def _chain(result: dict) -> str:
    return "torch imported via:\n  " + "\n  ".join(result["stack"] or ["(no stack recorded)"])


def test_import_does_not_import_torch(tmp_path):
    result = _torch_imported("import fastslow_sim, fastslow_sim.analysis", tmp_path)
    assert not result["torch"], _chain(result)


def test_torch_backed_names_still_import():
    # the lazy re-exports resolve to the real objects (and do import torch, in this process)
    from fastslow_sim.bridge import VARIANTS, FastSlowLM, flops_per_token
    from fastslow_sim.bridge.cost import flops_per_token as direct
    from fastslow_sim.bridge.model import VARIANTS as MODEL_VARIANTS

    assert flops_per_token is direct and VARIANTS is MODEL_VARIANTS
    assert FastSlowLM.__module__ == "fastslow_sim.bridge.model"
    import fastslow_sim.bridge as bridge

    assert set(bridge.__all__) <= set(dir(bridge))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bridge.nope  # noqa: B018


def test_package_import_loads_no_heavy_library(tmp_path):
    # then, in the same fresh process, the submodules are attributes as when the package
    # imported them (`fs.io`, `fs.solvers`: read through its `__getattr__`)
    code = ("import importlib, sys, fastslow_sim\n"
            "print(sorted(m for m in ('numba', 'scipy', 'xarray', 'torch', 'matplotlib')"
            " if m in sys.modules))\n"
            "for m in ('io', 'integrators', 'generators', 'stationary', 'systems', 'solvers'):\n"
            "    assert getattr(fastslow_sim, m) is importlib.import_module('fastslow_sim.' + m), m\n")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", f"import fastslow_sim loaded {res.stdout.strip()}"


def test_lazy_package_names_are_the_modules_objects():
    from importlib import import_module

    for name, module in fastslow_sim._LAZY.items():
        assert getattr(fastslow_sim, name) is getattr(import_module(f"fastslow_sim.{module}"), name)
    assert sorted(fastslow_sim.__all__) == sorted(
        {"__version__", "InputError", "ReducibleGeneratorError", *fastslow_sim._LAZY}
    )
    assert set(fastslow_sim.__all__) <= set(dir(fastslow_sim))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fastslow_sim.nope  # noqa: B018


# a real SIGINT, sent by the process to itself when the command line starts to load (where a
# Ctrl-C in the first second lands), then the console entry point as the installed script runs it
_SIGINT_WHILE_LOADING = """
import os, signal, sys

class _Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "fastslow_sim.cli":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _Interrupt())
from fastslow_sim.__main__ import run
sys.argv = ["fastslow-sim", "integrate", "--eps", "0.125", "--out", "result"]
run()
"""


def test_ctrl_c_while_the_command_loads_is_interrupted_not_a_traceback(tmp_path):
    res = subprocess.run([sys.executable, "-c", _SIGINT_WHILE_LOADING], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (res.returncode, res.stderr, res.stdout) == (130, "Interrupted.\n", "")
    assert list(tmp_path.iterdir()) == []


def test_console_script_is_the_entry_point_that_handles_ctrl_c():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"fastslow-sim": "fastslow_sim.__main__:run"}


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["integrate", "--help"],
        ["mapping"],
        ["integrate", "--eps", "0.125", "--t-end", "1", "--n-eval", "11"],
        ["integrate", "--system", "two-state", "--P", "16", "--method", "bdf", "--t-end", "1"],
        ["convergence", "--system", "two-state", "--eps", "0.02,0.01", "--t-end", "1"],
        ["manifold", "--kappa", "0", "--no-plot"],
    ],
    ids=" ".join,
)
@pytest.mark.slow
def test_commands_without_network_do_not_import_torch(args, tmp_path):
    result = _torch_imported(_cli(args), tmp_path)
    assert not result["torch"], f"fastslow-sim {' '.join(args)}: " + _chain(result)


def test_version_is_the_installed_metadata_written_once_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert fastslow_sim.__version__ == version("fastslow-sim") == project["version"]
    written = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "fastslow_sim").rglob("*.py"))
        if any(line.startswith("__version__ =") for line in p.read_text().splitlines())
    ]
    assert written == [], f"__version__ assigned by hand in {written}; it comes from metadata"


def test_wheel_holds_every_package(tmp_path):
    """A wheel built from a copy of the tree holds every package folder of fastslow_sim/."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "fastslow_sim", src / "fastslow_sim",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    (wheel,) = (tmp_path / "dist").glob("fastslow_sim-*.whl")
    in_wheel = {
        n.rsplit("/", 1)[0].replace("/", ".")
        for n in zipfile.ZipFile(wheel).namelist()
        if n.endswith("/__init__.py")
    }
    in_tree = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "fastslow_sim").rglob("__init__.py")
    }
    assert in_wheel == in_tree
    assert {"fastslow_sim.bridge", "fastslow_sim.analysis"} <= in_wheel
