#!/usr/bin/env bash
# stoker.Loader against torch's DataLoader from Python: prepares what the comparison needs (a
# venv with torch, torchvision, pillow and numpy; the stoker package built from ./python-client;
# a 5,000-image ImageNet-like set) and runs compare_loader.py, which runs each loader in a fresh
# process and prints images/s, time to first batch, added memory and the ratios.
#
# Usage: benches/compare_loader.sh [--count N] [--data DIR] [--batch-size 64] [--threads 2]
#                                  [--workers 0,1,2] [--batches K] [--json]
#   --count N   images in the generated set (default 5000); generated once, reused after.
#   --data DIR  image folder; with --count it is generated (or reused) there, without it DIR is
#               used as it is (any torchvision ImageFolder tree works).
#   Everything else goes to compare_loader.py. STOKER_BENCH_VENV overrides the venv path
#   (default <repo>/.venv-bench); STOKER_BENCH_SKIP_INSTALL=1 keeps the installed package.
set -euo pipefail

usage_lines="2,13"
# shellcheck source=bench_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_env.sh"

cd "$repo"
if [[ "${STOKER_BENCH_SKIP_INSTALL:-0}" != 1 ]] || ! "$venv/bin/python" -c 'import stoker' 2>/dev/null; then
    echo "building and installing ./python-client into $venv (release profile)" >&2
    "$venv/bin/python" -m pip install --quiet ./python-client >&2
fi

if [[ -z "$data" || -n "$count" ]]; then
    count="${count:-5000}"
    # Honour CARGO_TARGET_DIR and .cargo/config overrides instead of assuming ./target.
    target_dir="$(cargo metadata --format-version 1 --no-deps |
        "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    data="${data:-$target_dir/bench-data/imagenet-like-$count}"
    echo "making (or reusing) $count images in $data" >&2
    data="$("$venv/bin/python" -c 'import sys; from stoker._native import make_dataset; print(make_dataset(sys.argv[1], int(sys.argv[2])))' "$data" "$count")"
fi

exec "$venv/bin/python" "$repo/benches/compare_loader.py" \
    --data "$data" ${passthrough[@]+"${passthrough[@]}"}
