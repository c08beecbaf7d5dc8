#!/usr/bin/env bash
# Wheel check (called by .ci/run after the tests): build the wheel from the working tree,
# install it, not editable, into a fresh virtual environment and run one short call of every
# command from there. An editable install hides a package that the build leaves out (DESIGN 4,
# "Packages listed by hand"); this check does not.
#
# The environment sees the system's site-packages, so torch, numpy and the rest are not
# downloaded again (pip installs with --no-index: a dependency that is missing there fails the
# check), and the check makes sure that the fastslow_sim it runs is the wheel's, not the
# checkout's. Exits non-zero as soon as a step fails. KEEP=1 keeps the work folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
ROOT=$PWD
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastslow-wheel.XXXXXX")
if [[ "${KEEP:-0}" == 1 ]]; then echo "check_wheel: work folder $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
start=$SECONDS
# One thread for OpenBLAS and for torch (OpenMP). On a busy machine their thread pools make tiny
# problems crawl: the me corpus's 75,000 expm calls on 8 x 8 matrices took 48 s against 3 s for
# 10,000 blocks, and phi-vs-pst's batch-of-one forward passes 207 s against 31 s (2 shared cores,
# load 5). This is a smoke check of the wheel, not a benchmark.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
say() { echo "check_wheel: $*"; }

# 1. The wheel, built from a copy of the files git tracks or would track (a build/ folder left in
#    the checkout by an earlier build could otherwise add modules that no longer exist).
mkdir -p "$WORK/src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [[ -e "$f" ]] && printf '%s\0' "$f"
  done | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
else
  cp -R pyproject.toml README.md fastslow_sim "$WORK/src/"
fi
# without build isolation where setuptools is recent enough (nothing downloaded)
isolation=()
if "$PY" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 68)' 2>/dev/null; then
  isolation=(--no-build-isolation)
fi
"$PY" -m pip wheel -q --no-deps "${isolation[@]}" --disable-pip-version-check \
  -w "$WORK/dist" "$WORK/src"
wheel=$(ls "$WORK"/dist/fastslow_sim-*.whl)
say "built $(basename "$wheel") in $((SECONDS - start)) s"

# 2. A fresh environment with the wheel (no pip of its own: the system's pip installs into it).
"$PY" -m venv --system-site-packages --without-pip "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$PY" -m pip --python "$VPY" install -q --no-index --disable-pip-version-check "$wheel"
BIN="$WORK/venv/bin/fastslow-sim"
mkdir -p "$WORK/run"
cd "$WORK/run" # not the checkout: nothing of it may be on sys.path
"$VPY" - "$WORK/venv" <<'EOF'
import importlib, sys
from pathlib import Path

venv = Path(sys.argv[1]).resolve()
for name in ("fastslow_sim", "fastslow_sim.analysis", "fastslow_sim.bridge", "fastslow_sim.bridge.model"):
    path = Path(importlib.import_module(name).__file__).resolve()
    if venv not in path.parents:
        sys.exit(f"check_wheel: {name} comes from {path}, not from the wheel in {venv}")
print(f"check_wheel: fastslow_sim {sys.modules['fastslow_sim'].__version__} imported from {venv}")
EOF

# 3. One short call of every command, from the wheel's console script.
run() {
  local t0=$SECONDS
  if ! "$BIN" "$@" >"$WORK/out.txt" 2>&1; then
    cat "$WORK/out.txt"
    say "FAILED: fastslow-sim $*"
    exit 1
  fi
  say "ok ($((SECONDS - t0)) s): fastslow-sim $* -> $(tail -n 1 "$WORK/out.txt")"
}
expect() { for f in "$@"; do [[ -s "$f" ]] || { say "FAILED: $f was not written"; exit 1; }; done; }

run --version
run --help
"$VPY" -m fastslow_sim --help >/dev/null || { say "FAILED: python -m fastslow_sim --help"; exit 1; }
run integrate --eps 0.125
expect fastslow-results/integrate-birth-death-eps0.125.nc fastslow-results/integrate-birth-death-eps0.125.png
run integrate --system two-state --P 16 --t-end 0.5 --method rodas4 --no-plot
run convergence --system two-state --eps 0.02,0.01 --t-end 1
expect fastslow-results/convergence-two-state.png
run manifold --kappa 0
expect fastslow-results/manifold-birth-death-kappa0.png
run mapping
run corpus random
tiny=(--tokens 1024 --context 32 --batch-size 4) # 8 steps
run train-network --corpus random "${tiny[@]}" --out runs/train
expect runs/train/train.nc runs/train/summary.json
run reproduce --corpus me "${tiny[@]}" --seeds 1 --variants dense,coupled --out runs/reproduce-me
expect runs/reproduce-me/ablation.nc
run phi-vs-pst runs/reproduce-me/coupled-seed0
run sweep integrate --grid eps=0.1,0.05 --grid seed=0:1 --store runs/sweep.zarr --workers 2 \
  --t-end 0.5 --n-eval 5
expect runs/sweep.zarr/zarr.json
run training-figures --runs runs --out-dir figures
expect figures/training-gates.png figures/training-val-loss.png figures/training-wall-clock.png
run figures --only ode --out figures --results-dir results
expect figures/integrate-birth-death.png figures/equilibrium-manifold.png \
  figures/convergence.png figures/nonlinear-branches.png figures/multirate-map.pdf
cd "$ROOT"
say "passed in $((SECONDS - start)) s"
