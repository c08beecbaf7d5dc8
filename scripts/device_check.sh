#!/usr/bin/env bash
# The GPU checks of issue 15 as one short script for a machine with CUDA (none was lent when this
# was written: the CUDA numbers are unmeasured). DEVICE_CHECK_CPU=1 runs, on the CPU at tiny
# sizes, steps 0 and 1 (the imports; torch's version, not the device query), step 3's rodas4
# rows through the accelerator path (`--accelerator-device cpu`) and its diffrax row on JAX's
# CPU backend (skipped, with the reason, where JAX or diffrax is missing), and step 4's
# training-loop table in bf16 autocast (`--only-training-loop`, T = 16). Only a GPU run
# exercises the CUDA tests (step 2), nvidia-smi and the device's properties (step 1),
# rodas4 and diffrax on the GPU, bench_network's forward+backward table and MFU under
# `--device cuda` (step 4), and train-network --device cuda (step 5). The whole script stops
# within DEVICE_CHECK_BUDGET_S (default 420 s, so that it fits one 600-s device call with time
# to spare in a 15-minute device budget): each step has its own time limit, cut to what is left
# of the budget, and a step with under 15 s left is skipped and says so. Logs go to
# ${OUT:-gpu-check}/; a failing step does not stop the others (the summary lists every step's
# exit status).
#
#   scripts/device_check.sh                    # on a machine with CUDA
#   DEVICE_CHECK_CPU=1 scripts/device_check.sh # steps 0, 1, 3, 4 in part on the CPU (a test)
#
# Steps:
#   0. the imports the steps need (a bare machine may lack some; each missing one is named);
#   1. the device: torch's name for it (the key of the MFU peak table) and nvidia-smi's power
#      limit (an H200 NVL reports the same name as an H200 SXM; see bridge/cost.py PEAK_FLOPS);
#   2. the CUDA tests (rodas4 on CUDA against the CPU);
#   3. rodas4 at 65,536 trajectories of the benchmark problem on the GPU, then diffrax
#      Kvaerno3 on the same GPU and initial conditions where JAX has CUDA (JAX's CUDA build,
#      `pip install jax[cuda12] diffrax`; otherwise the row is skipped with the reason), on an
#      evenly spaced 8,192 of them, judged against rodas4 timed on the same 8,192 (a GPU is far
#      from full at a small batch, so scaling a wall per trajectory would be unfair); the error
#      on 8 trajectories against a scipy Radau reference (about 2 s each on the CPU); Kvaerno5
#      is left to bench_integrators.py's own defaults (on the CPU, at 1,024 trajectories, its
#      warm solve took 90 s against Kvaerno3's 32 s: scripts/BENCHMARKS.md);
#   4. the network in bf16: the training-loop table (T = 256, 1024) and forward+backward at
#      T = 1024, 4096, 8192, with MFU against the device's peak (none for an unknown device);
#   5. bf16 training of the dense and coupled arms (500k tokens each, MFU in summary.json).
# Worst case, every step at its limit: 30 + 30 + 90 + 120 + 90 + 2 x 60 = 480 s, cut to the
# budget (420 s), plus up to 130 s for the first CUDA check and 10 s per killed step; expected
# on an H100/H200 about 3 minutes (unmeasured).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
cpu="${DEVICE_CHECK_CPU:-0}"
budget="${DEVICE_CHECK_BUDGET_S:-420}"
case "$budget" in
  '' | *[!0-9]*) echo "DEVICE_CHECK_BUDGET_S must be a whole number of seconds; got '$budget'."; exit 2 ;;
esac
start=$SECONDS
status=()

step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log to $out/NAME.log
  local name="$1" limit="$2"
  shift 2
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 15 ]; then
    echo "== $name: skipped, ${left} s left of the ${budget}-s budget" | tee "$out/$name.log"
    status+=("$name: skipped (budget)")
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== $name (limit ${limit} s): $*" | tee "$out/$name.log"
  timeout -k 10 "$limit" "$@" >>"$out/$name.log" 2>&1
  local rc=$?
  tail -n +2 "$out/$name.log" | tail -n 40
  status+=("$name: exit $rc$([ "$rc" = 124 ] && echo ' (time limit)')")
}

imports="import torch, numpy, scipy, xarray, click, torchdiffeq, numba, fastslow_sim
for m in ('jax', 'diffrax'):
    try:
        __import__(m)
    except ImportError as e:
        print(m, 'missing (its rows are skipped):', e)
print('imports: ok')"

if [ "$cpu" = "1" ]; then
  echo "DEVICE_CHECK_CPU=1: steps 0, 1, 3 and 4 in part on the CPU with tiny sizes (tests the script, measures nothing; no CUDA test, forward+backward table or training)"
  step imports 30 "$PY" -c "$imports"
  step device 60 "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  step bench_integrators 600 "$PY" scripts/bench_integrators.py --gpu-only --accelerator-device cpu \
    --gpu-batch 8 --gpu-rounds 1 --diffrax-configs Kvaerno3:0.3:0.3 --gpu-diffrax-trajectories 4 \
    --reference 2
  step bench_network 600 "$PY" scripts/bench_network.py --device cpu --autocast --only-training-loop \
    --loop-Ts 16 --rounds 1
else
  timeout -k 10 120 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
    echo "no CUDA device (torch.cuda.is_available() is False); DEVICE_CHECK_CPU=1 tests the script on the CPU"
    exit 1
  }
  step imports 30 "$PY" -c "$imports"
  step device 30 bash -c "$PY -c \"import torch; p = torch.cuda.get_device_properties(0); \
print(repr(torch.cuda.get_device_name(0)), p.total_memory // 2**20, 'MiB', p.multi_processor_count, 'SMs', \
'torch', torch.__version__, 'cuda', torch.version.cuda)\"; \
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv || true; \
$PY -c \"import jax; print('jax', jax.__version__, jax.devices())\" || echo 'jax: not importable'"
  step pytest-cuda 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_rosenbrock.py -k cuda
  step bench_integrators 120 "$PY" scripts/bench_integrators.py --gpu-only --gpu-batch 65536 \
    --diffrax-configs Kvaerno3:0.3:0.3 --gpu-diffrax-trajectories 8192 --reference 8
  # 40 training-loop rounds: the batch-means interval (blocks of 5) has df 7 (10 rounds gave df 1,
  # almost always "inconclusive"); at a few ms an iteration (L=4, d=128, batch 8 on an H200),
  # 3 arms x (2 + 40) iterations x 2 T are about 1-3 s of the step's 90
  step bench_network 90 "$PY" scripts/bench_network.py --device cuda --autocast --rounds 5 --loop-rounds 40
  for v in dense coupled; do
    step "train-$v" 60 "$PY" -m fastslow_sim train-network --variant "$v" --corpus me --device cuda \
      --out "$out/train-$v" --json
  done
fi
echo "== summary after $((SECONDS - start)) s of the ${budget}-s budget (logs in $out/)"
printf '%s\n' "${status[@]}" | tee "$out/summary.txt"
