#!/usr/bin/env bash
# The GPU checks, as one short script for a machine with CUDA (none was lent when this was
# written, so these paths are implemented and CPU-tested but their numbers are unmeasured).
# Expected run time on an H100/H200: a few minutes. Writes logs to ${OUT:-gpu-check}/.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" || exit 1
# 1. the CUDA tests (rodas4 on CUDA against the CPU)
python3 -m pytest -q tests/test_rosenbrock.py -k cuda 2>&1 | tee "$out/pytest-cuda.log"
# 2. 65,536 trajectories of the issue-4 problem on the GPU (the LSODA loop and the minutes-long
#    torch.compile row are skipped)
python3 scripts/bench_integrators.py --skip-lsoda --skip-compile --batch 1024 --gpu-batch 65536 2>&1 | tee "$out/bench_integrators.log"
# 3. the network table in bf16 at T = 1024, 4096, 8192 with MFU
python3 scripts/bench_network.py --rounds 5 2>&1 | tee "$out/bench_network.log"
# 4. bf16 training of the dense and coupled arms, 500k tokens each, with MFU in summary.json
for v in dense coupled; do
  fastslow-sim train-network --variant "$v" --corpus me --device cuda --out "$out/train-$v" --json \
    2>&1 | tail -1 | tee "$out/train-$v.json"
done
