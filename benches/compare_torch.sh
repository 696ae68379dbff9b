#!/usr/bin/env bash
# Stoker against torch's DataLoader on one ImageNet-like image set: prepares what the comparison
# needs (a venv with torch, the release `stoker` binary, the image set) and runs
# compare_torch.py, which runs both loaders on the same files and cores and prints the ratios.
#
# Usage: benches/compare_torch.sh [--count N] [--data DIR] [--batch-size 64]
#                                 [--workers 2 | --threads 2] [--batches K] [--repeat R]
#                                 [--cpus 0,1] [--json]
#   --count N   images in the generated set (default 5000); generated once, reused after.
#   --data DIR  image folder; with --count it is generated (or reused) there, without it DIR is
#               used as it is (any torchvision ImageFolder tree works).
#   Everything else goes to compare_torch.py. STOKER_BENCH_VENV overrides the venv path
#   (default <repo>/.venv-bench).
set -euo pipefail

usage_lines="2,13"
# shellcheck source=bench_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_env.sh"

cd "$repo"
cargo build --release -p stoker-cli >&2
# Honour CARGO_TARGET_DIR and .cargo/config overrides instead of assuming ./target.
target_dir="$(cargo metadata --format-version 1 --no-deps |
    "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
stoker="$target_dir/release/stoker"

if [[ -z "$data" || -n "$count" ]]; then
    count="${count:-5000}"
    data="${data:-$target_dir/bench-data/imagenet-like-$count}"
    "$stoker" make-dataset --count "$count" --out "$data" >&2
fi

exec "$venv/bin/python" "$repo/benches/compare_torch.py" \
    --stoker "$stoker" --data "$data" ${passthrough[@]+"${passthrough[@]}"}
