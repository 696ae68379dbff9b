#!/usr/bin/env bash
# stoker.Loader against Mosaic Streaming's own StreamingDataset on the same MDS shards: prepares
# the bench venv (torch, torchvision, pillow, numpy, and mosaicml-streaming), the stoker package
# and a 5,000-image set, which compare_streaming.py writes once as MDS shards with Streaming's
# MDSWriter beside it, then runs each loader in a fresh process.
#
# Usage: benches/compare_streaming.sh [--count N] [--data DIR] [--threads 2] [--workers 2]
#                                     [--compression zstd] [--repeat R] [--batches K] [--json]
set -euo pipefail

usage_lines="2,8"
# shellcheck source=bench_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_env.sh"

if ! "$venv/bin/python" -c 'import streaming' 2>/dev/null; then
    echo "installing mosaicml-streaming into $venv" >&2
    "$venv/bin/python" -m pip install --quiet "mosaicml-streaming==0.13.*" >&2
fi
run_image_comparison 5000 compare_streaming.py
