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

run_image_comparison 5000 compare_loader.py
