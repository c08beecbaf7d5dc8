#!/usr/bin/env bash
# Installs fastslow-sim (editable) with everything it needs, on a fresh machine or an existing one.
#
# torch: an installed torch (for example a user's CUDA build) is kept as it is. Where none is
# installed, torch==2.13.0 is installed first: on this project's machines pip takes the CPU
# wheel that lies on disk, whereas a bare `torch` requirement would pull a CUDA build of several
# GB. The package itself asks for torch>=2.1, which the installed torch then satisfies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  echo "setup: no torch found; installing torch==2.13.0 (CPU build)"
  "$PY" -m pip install --disable-pip-version-check -q "torch==2.13.0"
fi
"$PY" -m pip install --disable-pip-version-check -q -e ".[test]"
# pyenv puts console scripts behind shims that exist only after a rehash
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
echo "setup: fastslow-sim $("$PY" -c 'import fastslow_sim; print(fastslow_sim.__version__)') installed"
