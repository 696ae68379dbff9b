#!/usr/bin/env bash
# Stoker against torch's DataLoader on a token file (nanoGPT-style .bin): prepares what the
# comparison needs (a venv with torch and numpy, the stoker package built from ./python-client,
# a seeded token file) and runs compare_tokens.py, which reads shuffled windows of
# seq_len + 1 tokens with both loaders, side by side, and prints tokens/s and the ratio.
#
# Usage: benches/compare_tokens.sh [--count N] [--data FILE] [--seq-len 2048] [--batch-size 32]
#                                  [--workers 2] [--threads 2] [--batches K] [--repeat R] [--json]
#   --count N   tokens in the generated file (default 150000000, uint16, 300 MB); generated
#               once under <target>/bench-data, reused after.
#   --data FILE a token file to use as it is (uint16 unless named *.u32.bin).
#   Everything else goes to compare_tokens.py. STOKER_BENCH_VENV overrides the venv path
#   (default <repo>/.venv-bench); STOKER_BENCH_SKIP_INSTALL=1 keeps the installed package.
set -euo pipefail

usage_lines="2,13"
# shellcheck source=bench_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_env.sh"

install_stoker

if [[ -z "$data" || -n "$count" ]]; then
    count="${count:-150000000}"
    data="${data:-$(bench_data_dir)/tokens-$count.bin}"
    if [[ ! -f "$data" ]]; then
        echo "writing $count seeded uint16 tokens to $data" >&2
        mkdir -p "$(dirname "$data")"
        "$venv/bin/python" -c 'import sys; from stoker._native import make_tokens; make_tokens(sys.argv[1], int(sys.argv[2]))' \
            "$data.partial" "$count"
        mv "$data.partial" "$data"
    fi
fi

exec "$venv/bin/python" "$repo/benches/compare_tokens.py" \
    --data "$data" ${passthrough[@]+"${passthrough[@]}"}
