#!/usr/bin/env bash
# How the decode thread count moves ResNet-18's training pace with decode="gpu" and "auto", on a
# GPU machine after benches/gpu/pack.sh (run from the repository root): gpu_train.py's rows at
# several thread counts (the values in THREADS, default "3 5 7 11 15") beside the ceiling, 100
# steps after 10, run twice. The decode threads share the host's cores with the training loop's
# own thread, so this shows what the cores bound and what the GPU does. Logs go to $OUT: the
# rows in threads.log, every line the runs printed in threads-full.log.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benches/gpu/install.sh
rows=ceiling
for threads in ${THREADS:-3 5 7 11 15}; do
    rows+=",stoker-gpu@$threads,stoker-auto@$threads"
done
for run in 1 2; do
    echo "== run $run" | tee -a "$out/threads.log"
    timeout 150 python3 benches/gpu_train.py --data "$data" --models resnet18 --workers 15 \
        --steps 100 --rows "$rows" 2>&1 | tee -a "$out/threads-full.log" \
        | grep '^resnet18' | tee -a "$out/threads.log"
    step_done "${PIPESTATUS[0]}" run "$run"
done
exit "$failed"
