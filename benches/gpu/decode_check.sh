#!/usr/bin/env bash
# The GPU decode lane's check, run from the repository root on a machine with an NVIDIA GPU
# (what benches/gpu/run.sh needs, plus pillow): installs what benches/gpu/pack.sh put in
# `.device/`, starts one loader with decode="gpu" (a smoke test, with Python's fault handler),
# runs the GPU tests (`pytest -m gpu` of tests/test_gpu.py and tests/test_gpu_decode.py), what
# fencing released pinned batches on torch's whole stream pool costs (fence_cost.py), then
# the training benchmark's decode rows on a generated set: ResNet-18 with decode="cpu", "gpu" and
# "auto" beside NVIDIA DALI (its default hardware-decoder load and 0.99, and the pipeline of
# DALI's ResNet-50 example, which decodes each crop window alone; installed when
# benches/gpu/pack_dali.sh's parts were carried, else its rows say they skip), the same with 7
# decode threads, and the loader alone; then the "gpu" and "auto" rows
# again with the training loop on a stream of its own (gpu_train.py --side-stream). Logs go to
# $OUT.
# SMOKE_ONLY=1 stops after the smoke test, SKIP_PYTEST=1 leaves out the tests, SKIP_BENCH=1 the
# benchmark; COMPILE=1 adds the ResNet-18 rows with the model compiled (CUDA graphs) to the
# levers, COMPILE=only runs them alone after the smoke test (7 minutes at worst). Then the
# levers: the side-stream rows, the lane's pipes in green contexts of a few SMs (the -smsN rows)
# and its kernel writing the normalised rows itself (the -fused rows), the loader in a helper
# process (gpu_train.py's helper-* rows), and with MPS=1 again under MPS (MPS=only: those
# alone after the smoke test, 5.5 minutes at worst; MPS=1 with the levers passes one call's
# 10 minutes). SKIP_LEVERS=1 stops before the levers; LEVERS_ONLY=1 runs the smoke test and
# the levers alone.
# Time: about 2 minutes on an H200 with 16 cores, tests included, on 2026-11-27, before the
# DALI rows, the levers and the newer GPU tests were added; it has not run since. The timeouts
# add up to more than the 10 minutes one device call may take, so run it as three calls, in
# this order of priority (worst cases, install.sh's time not counted): SKIP_BENCH=1 (smoke test
# and GPU tests, 7 minutes, 9.5 when the smoke test fails and the sanitizer runs),
# SKIP_PYTEST=1 SKIP_LEVERS=1 (fence cost and the rows beside DALI, 9), LEVERS_ONLY=1 (just
# under 10); then COMPILE=only, MPS=only, LANEPROC=only (the decode lane alone in
# stoker-lane-helper, the -laneproc rows, 5 minutes at worst) and ROI=only (the lane decoding
# only each crop window, the -roi rows, 5 minutes at worst) as time allows.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benches/gpu/install.sh
started=$SECONDS
timeout 120 python3 - "$data" <<'PY' 2>&1 | tee "$out/smoke.log"
import sys, time
import numpy as np
import stoker
from stoker import _native, gpu
print("lane problem:", _native.gpu_decode_unavailable(0, gpu.cuda_library_dirs()))
def images(decode, n=3):
    options = dict(pipeline=[stoker.ops.DecodeImage(dct_scaling=False), *stoker.vision.imagenet_train(224)[1:]],
                   batch_size=64, num_threads=8, device="cuda", decode=decode, seed=4)
    with stoker.Loader(sys.argv[1], **options) as loader:
        return [b["image"].cpu().numpy().astype(np.int16) for _, b in zip(range(n), loader)]
diff = np.mean([np.abs(a - b).mean() for a, b in zip(images("cpu"), images("gpu"))])
print(f"parity: mean abs diff {diff:.3f} grey levels (dct_scaling off)")
for decode in ("gpu", "auto"):
    made = time.perf_counter()
    loader = stoker.Loader(sys.argv[1], pipeline=stoker.vision.imagenet_train(224), batch_size=256,
                           num_threads=15, device="cuda", decode=decode, drop_last=True)
    print(decode, "built in", round(time.perf_counter() - made, 3), "s")
    it = iter(loader)
    first = next(it)["image"]
    print(decode, "first batch", first.shape, first.dtype, round(time.perf_counter() - made, 3), "s")
    started, n = time.perf_counter(), 0
    for n, batch in enumerate(it, 1):
        if n == 30:
            break
    import torch
    torch.cuda.synchronize()
    print(decode, f"{n * 256 / (time.perf_counter() - started):.0f} img/s loader alone", loader.stats()["gpu_decode"], flush=True)
    loader.close()
PY
smoke=${PIPESTATUS[0]}
echo "smoke: exit $smoke, $((SECONDS - started)) s"
if [ "$smoke" -ne 0 ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    # Where the fault is: a few small batches under the memory checker.
    timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 5 python3 - "$data" <<'PY' 2>&1 | tail -60 | tee "$out/sanitizer.log"
import sys
import stoker
loader = stoker.Loader(sys.argv[1], pipeline=stoker.vision.imagenet_train(64), batch_size=4,
                       num_threads=2, device="cuda", decode="gpu")
for n, batch in enumerate(loader):
    if n == 2:
        break
print("sanitized run done", loader.stats()["gpu_decode"])
PY
fi
step_done "$smoke" smoke test
[ "${SMOKE_ONLY:-0}" = 1 ] && exit "$smoke"
# COMPILE=only and MPS=only run the smoke test and the compiled or MPS rows alone.
levers_only=0
if [ "${LEVERS_ONLY:-0}" = 1 ] || [ "${COMPILE:-0}" = only ] || [ "${MPS:-0}" = only ] || [ "${LANEPROC:-0}" = only ] || [ "${ROI:-0}" = only ]; then
    levers_only=1
fi
helper_rows=ceiling,stoker-auto,helper-cuda,helper-gpu,helper-auto,stoker-auto@7,helper-auto@7
started=$SECONDS
# The slowest tests named; where pytest-timeout is installed, a test that hangs in Python code
# (not inside a native call) fails alone
# after 120 s instead of taking the whole run's time.
pytest_flags=(-m gpu -q -rs -s -p no:cacheprovider --durations=15)
if python3 -c "import pytest_timeout" 2>/dev/null; then pytest_flags+=(--timeout=120); fi
[ "${SKIP_PYTEST:-0}" = 1 ] || [ "$levers_only" = 1 ] || (cd python-client && timeout 300 python3 -m pytest "${pytest_flags[@]}" tests/test_gpu.py tests/test_gpu_decode.py 2>&1) | tee "$out/pytest.log"
step_done "${PIPESTATUS[0]}" pytest -m gpu
echo "pytest -m gpu: $((SECONDS - started)) s"
started=$SECONDS
[ "${SKIP_BENCH:-0}" = 1 ] || [ "$levers_only" = 1 ] || timeout 150 python3 benches/gpu/fence_cost.py --data "$data" --rounds 2 2>&1 | tee "$out/fence-cost.log"
step_done "${PIPESTATUS[0]}" fence_cost.py
echo "fence_cost: $((SECONDS - started)) s"
# A lane that does not start or crashes has nothing to measure.
[ "$smoke" -eq 0 ] || exit 1
[ "${SKIP_BENCH:-0}" = 1 ] && exit "$failed"
if [ "$levers_only" != 1 ]; then
    started=$SECONDS
    rows=ceiling,stoker-cuda,stoker-gpu,stoker-auto,dali,dali-crop,dali-hw99,stoker-cuda@7,stoker-auto@7,stoker-gpu@7,dali@7,loader:stoker-cuda,loader:stoker-gpu,loader:stoker-auto,loader:dali
    timeout 260 python3 benches/gpu_train.py --data "$data" --models resnet18 --rows "$rows" --workers "$(( $(nproc) - 1 ))" 2>&1 | tee "$out/bench.log"
    step_done "${PIPESTATUS[0]}" gpu_train.py beside DALI
    echo "gpu_train: $((SECONDS - started)) s"
fi
[ "${SKIP_LEVERS:-0}" = 1 ] && exit "$failed"
if [ "${COMPILE:-0}" != only ] && [ "${MPS:-0}" != only ] && [ "${LANEPROC:-0}" != only ] && [ "${ROI:-0}" != only ]; then
    started=$SECONDS
    timeout 100 python3 benches/gpu_train.py --data "$data" --models resnet18 --rows ceiling,stoker-gpu,stoker-auto --workers "$(( $(nproc) - 1 ))" --side-stream 2>&1 | tee "$out/bench-side-stream.log"
    step_done "${PIPESTATUS[0]}" gpu_train.py --side-stream
    echo "gpu_train --side-stream: $((SECONDS - started)) s"
fi
if [ "${COMPILE:-0}" = 1 ] || [ "${COMPILE:-0}" = only ]; then
    # The step as a CUDA graph (torch.compile reduce-overhead), beside the lane and DALI.
    started=$SECONDS
    timeout 300 python3 benches/gpu_train.py --data "$data" --models resnet18 --rows ceiling,stoker-auto,dali --workers "$(( $(nproc) - 1 ))" --compile --warmup 40 2>&1 | tee "$out/bench-compiled.log"
    step_done "${PIPESTATUS[0]}" gpu_train.py --compile
    echo "gpu_train --compile: $((SECONDS - started)) s"
fi
[ "${COMPILE:-0}" = only ] && exit "$failed"
if [ "${ROI:-0}" = only ]; then
    # The hardware engines decoding only each image's crop window (STOKER_GPU_DECODE_ROI=1, the
    # -roi rows) beside the same rows decoding whole images, and the loader alone both ways.
    started=$SECONDS
    timeout 180 python3 benches/gpu_train.py --data "$data" --models resnet18 --rows ceiling,stoker-gpu,stoker-gpu-roi,stoker-auto,stoker-auto-roi,loader:stoker-gpu,loader:stoker-gpu-roi --workers "$(( $(nproc) - 1 ))" 2>&1 | tee "$out/bench-roi.log"
    step_done "${PIPESTATUS[0]}" gpu_train.py -roi rows
    echo "gpu_train -roi rows: $((SECONDS - started)) s"
    exit "$failed"
fi
if [ "${LANEPROC:-0}" = only ]; then
    # The decode lane alone in Stoker's helper process (stoker-lane-helper, the -laneproc rows)
    # beside the same rows with the lane in the training process.
    started=$SECONDS
    timeout 180 python3 benches/gpu_train.py --data "$data" --models resnet18 --rows ceiling,stoker-gpu,stoker-gpu-laneproc,stoker-auto,stoker-auto-laneproc,loader:stoker-gpu-laneproc --workers "$(( $(nproc) - 1 ))" 2>&1 | tee "$out/bench-laneproc.log"
    step_done "${PIPESTATUS[0]}" gpu_train.py -laneproc rows
    echo "gpu_train -laneproc rows: $((SECONDS - started)) s"
    exit "$failed"
fi
if [ "${MPS:-0}" != only ]; then
# The lane's pipes in green contexts of 16 and 32 SMs (STOKER_GPU_DECODE_SMS): does the lane
# slow the step by taking its SMs? And the lane's kernel writing the normalised rows itself
# (STOKER_GPU_DECODE_FUSED_TAIL=1, the -fused rows; the stage then skips its normalising pass
# for a batch whose rows all came from the lane): do the stage's launches on the training
# thread matter? Beside the same rows without.
started=$SECONDS
timeout 180 python3 benches/gpu_train.py --data "$data" --models resnet18 --rows ceiling,stoker-gpu,stoker-gpu-fused,stoker-gpu-sms16,stoker-gpu-sms32,stoker-auto,stoker-auto-fused,stoker-auto-sms16 --workers "$(( $(nproc) - 1 ))" 2>&1 | tee "$out/bench-green.log"
step_done "${PIPESTATUS[0]}" gpu_train.py green-context and fused-tail rows
echo "gpu_train green-context and fused-tail rows: $((SECONDS - started)) s"
# The loader in a helper process with its own CUDA context, its batches handed over through
# CUDA IPC (the experiment that tells contention inside the training process from contention
# on the GPU), beside the same rows in process; MPS=1 runs the helper rows again under MPS
# (a control daemon started for this run alone, and stopped after it).
started=$SECONDS
timeout 180 python3 benches/gpu_train.py --data "$data" --models resnet18 --rows "$helper_rows" --workers "$(( $(nproc) - 1 ))" 2>&1 | tee "$out/bench-helper.log"
step_done "${PIPESTATUS[0]}" gpu_train.py helper rows
echo "gpu_train helper rows: $((SECONDS - started)) s"
fi
if { [ "${MPS:-0}" = 1 ] || [ "${MPS:-0}" = only ]; } && command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    started=$SECONDS
    export CUDA_MPS_PIPE_DIRECTORY="$out/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps-log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        timeout 200 python3 benches/gpu_train.py --data "$data" --models resnet18 --rows "$helper_rows" --workers "$(( $(nproc) - 1 ))" 2>&1 | tee "$out/bench-helper-mps.log"
        step_done "${PIPESTATUS[0]}" gpu_train.py helper rows under MPS
        echo quit | nvidia-cuda-mps-control
    else
        echo "MPS: the control daemon did not start" | tee "$out/bench-helper-mps.log"
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    echo "gpu_train helper rows under MPS: $((SECONDS - started)) s"
fi
exit "$failed"
