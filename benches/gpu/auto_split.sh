#!/usr/bin/env bash
# Where decode="auto" puts its split, on a GPU machine after benches/gpu/pack.sh (run from the
# repository root): gpu_train.py's ResNet-18 rows with 150 steps after 10, so that `auto` has
# points to move in. First `auto` held at fixed splits (STOKER_GPU_DECODE_SPLIT, the values in
# SPLITS, default "8 12 14 16"), then `auto` as it decides, with 15 threads, with 7, and the
# loader alone, then the `gpu` rows beside the ceiling as the reference. When `.device/old/`
# holds another wheel (an earlier commit's, from `maturin build --release --strip`), the `auto`
# rows of that wheel and of this one run alternately, twice each. Logs go to $OUT: the rows in
# auto_split.log, every line the runs printed in auto_split-full.log.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benches/gpu/install.sh
common=(--data "$data" --models resnet18 --workers 15 --steps 150)
auto_rows=stoker-auto,stoker-auto@7,loader:stoker-auto
for split in ${SPLITS:-8 12 14 16}; do
    echo "== auto held at $split/16" | tee -a "$out/auto_split.log"
    STOKER_GPU_DECODE_SPLIT=$split timeout 60 python3 benches/gpu_train.py "${common[@]}" \
        --rows stoker-auto,stoker-auto@7 2>&1 | tee -a "$out/auto_split-full.log" \
        | grep '^resnet18' | tee -a "$out/auto_split.log"
    step_done "${PIPESTATUS[0]}" auto held at "$split/16"
done
sites=("$site")
if ls .device/old/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$scratch/stoker-old-site" .device/old/*.whl || exit 1
    sites=("$site" "$scratch/stoker-old-site" "$site" "$scratch/stoker-old-site")
fi
for which in "${sites[@]}"; do
    echo "== auto deciding, package from $which" | tee -a "$out/auto_split.log"
    PYTHONPATH=$which timeout 60 python3 benches/gpu_train.py "${common[@]}" --rows "$auto_rows" 2>&1 \
        | tee -a "$out/auto_split-full.log" | grep '^resnet18' | tee -a "$out/auto_split.log"
    step_done "${PIPESTATUS[0]}" auto deciding, package from "$which"
done
echo "== reference" | tee -a "$out/auto_split.log"
timeout 60 python3 benches/gpu_train.py "${common[@]}" \
    --rows ceiling,stoker-gpu,stoker-gpu@7,loader:stoker-gpu 2>&1 | tee -a "$out/auto_split-full.log" \
    | grep '^resnet18' | tee -a "$out/auto_split.log"
step_done "${PIPESTATUS[0]}" reference rows
exit "$failed"
