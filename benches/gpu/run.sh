#!/usr/bin/env bash
# The GPU check, run from the repository root on a machine with an NVIDIA GPU, Python 3.11+,
# torch with CUDA, torchvision, numpy and pytest (no Rust, no network): installs what
# benches/gpu/pack.sh put in `.device/`, runs the GPU tests (`pytest -m gpu`) and the training
# benchmark (benches/gpu_train.py) on a generated image set, and `stoker bench` on the same set
# (what the CPU threads alone decode there). Logs go to $OUT (default /tmp/stoker-gpu-out).
# Meant to end within 8 minutes on an H100 with 16 cores.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benches/gpu/install.sh
started=$SECONDS
(cd python-client && timeout 240 python3 -m pytest -m gpu tests/test_gpu.py -q -rs -p no:cacheprovider 2>&1) | tee "$out/pytest.log"
step_done "${PIPESTATUS[0]}" pytest -m gpu
echo "pytest -m gpu: $((SECONDS - started)) s"
started=$SECONDS
timeout 240 python3 benches/gpu_train.py --data "$data" --workers "$(( $(nproc) - 1 ))" 2>&1 | tee "$out/bench.log"
step_done "${PIPESTATUS[0]}" gpu_train.py
echo "gpu_train: $((SECONDS - started)) s"
timeout 60 "$bin/stoker" bench --data "$data" --threads "$(( $(nproc) - 1 ))" --batch-size 256 --batches 30 2>&1 | tee "$out/stoker-bench.log"
step_done "${PIPESTATUS[0]}" stoker bench
timeout 60 "$bin/stoker" bench --data "$data" --threads "$(nproc)" --batch-size 256 --batches 30 2>&1 | tail -3 | tee -a "$out/stoker-bench.log"
step_done "${PIPESTATUS[0]}" stoker bench, all cores
exit "$failed"
