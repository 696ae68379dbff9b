#!/usr/bin/env bash
# Measures two levers on the GPU decode lane beside training, run from the repository root on a
# machine with an NVIDIA GPU after benches/gpu/pack.sh (as benches/gpu/decode_check.sh):
#   - decode states at once: nvJPEG alone (benches/gpu/nvjpeg_beside_training.py --states) and
#     the lane with STOKER_GPU_DECODE_PIPES=2 and 4;
#   - CUDA_DEVICE_MAX_CONNECTIONS=32 (the driver's hardware queues per context, 8 by default),
#     so that nvJPEG's streams do not share a queue with the training stream.
# Then, unless SKIP_PYTEST=1, the lane's GPU tests with 4 pipes. What runs can be narrowed:
# NVJPEG_CONNECTIONS (default "8 32"; empty: none), CONFIGS (training benchmark runs as
# pipes:connections:threads, default "2:8:15 4:8:15 4:32:15"), ROWS (its rows). Logs go to $OUT.
# About 4 minutes on an H100 or H200 with 16 cores.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benches/gpu/install.sh
for connections in ${NVJPEG_CONNECTIONS-8 32}; do
    started=$SECONDS
    CUDA_DEVICE_MAX_CONNECTIONS=$connections timeout 90 python3 benches/gpu/nvjpeg_beside_training.py \
        --data "$data" --formats "" --states 1,2,4,8 --seconds 2 2>&1 | tee "$out/nvjpeg-connections$connections.log"
    step_done "${PIPESTATUS[0]}" nvjpeg states, "$connections" connections
    echo "nvjpeg states, $connections connections: $((SECONDS - started)) s"
done
rows=${ROWS:-ceiling,stoker-gpu,stoker-auto,stoker-auto@7,loader:stoker-gpu}
for config in ${CONFIGS:-2:8:15 4:8:15 4:32:15}; do
    IFS=: read -r pipes connections threads <<< "$config"
    started=$SECONDS
    STOKER_GPU_DECODE_PIPES=$pipes CUDA_DEVICE_MAX_CONNECTIONS=$connections timeout 150 python3 benches/gpu_train.py \
        --data "$data" --models resnet18 --rows "$rows" --workers "$threads" --gpu-memory 3072 \
        2>&1 | tee "$out/bench-pipes$pipes-connections$connections-threads$threads.log"
    step_done "${PIPESTATUS[0]}" gpu_train.py "$config"
    echo "gpu_train, $pipes pipes, $connections connections, $threads threads: $((SECONDS - started)) s"
done
[ "${SKIP_PYTEST:-0}" = 1 ] && exit "$failed"
started=$SECONDS
(cd python-client && STOKER_GPU_DECODE_PIPES=4 timeout 200 python3 -m pytest -m gpu tests/test_gpu_decode.py -q -rs -p no:cacheprovider 2>&1) | tee "$out/pytest-pipes4.log"
step_done "${PIPESTATUS[0]}" pytest -m gpu, 4 pipes
echo "pytest -m gpu, 4 pipes: $((SECONDS - started)) s"
exit "$failed"
