#!/usr/bin/env bash
# One torchvision-style Dataset (ImageFolder, PIL decode + v2 transforms) through DataLoader and
# through stoker.Loader.from_dataset (threads, and worker processes): prepares the bench venv
# (torch, torchvision, pillow, numpy; stoker built from ./python-client) and a 2,000-image
# ImageNet-like set, then runs compare_dataset.py, which prints images/s, CPU per image, first
# batch and loader memory of each, and the ratios to DataLoader.
#
# Usage: benches/compare_dataset.sh [--count N] [--data DIR] [--workers 2] [--batches K]
#                                   [--repeat R] [--json]
#   --count N   images in the generated set (default 2000); generated once, reused after.
#   --data DIR  an ImageFolder tree to use as it is.
#   Everything else goes to compare_dataset.py. STOKER_BENCH_VENV overrides the venv path
#   (default <repo>/.venv-bench); STOKER_BENCH_SKIP_INSTALL=1 keeps the installed package.
set -euo pipefail

usage_lines="2,13"
# shellcheck source=bench_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_env.sh"

run_image_comparison 2000 compare_dataset.py
