#!/usr/bin/env bash
# Packs NVIDIA DALI for the GPU machine, which has no network, in parts a device call can carry
# (a call carries 64 MiB with the working tree, about 5 MiB, so parts of 56 MiB): downloads here
# the wheels of nvidia-dali-cuda130 and what it imports (nvImageCodec, and the small pure-Python and
# binary packages it needs; JPEG decoding uses the machine's own CUDA 13 nvJPEG, and nvCOMP,
# for DALI's decompression operators only, is left out), puts them in one tar, and splits it
# into `.device-dali/N/part` (ignored by git), each with the whole tar's SHA256SUMS. Carry each
# `.device-dali/N` folder in its own call, one right after another while the machine stays
# warm (ignored files carried before are kept there until it goes back), then run the check;
# benches/gpu/install.sh joins the parts, checks the sum and installs DALI beside the wheel.
# Run from anywhere, with network. About 216 MiB, so 4 parts (DALI 2.4.0, 2026-12-02).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=.device-dali
if ! grep -qx '/.device-dali/' .git/info/exclude 2>/dev/null; then
    echo '/.device-dali/' >> .git/info/exclude
fi
python=.venv/bin/python
[ -x "$python" ] || python=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for package in "nvidia-dali-cuda130==2.4.*" "nvidia-nvimgcodec-cu13>=0.9,<0.10" astunparse \
    "gast<=0.7.0" six optree packaging makefun nvtx "libcst~=1.8"; do
    "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$work/wheels" "$package"
done
tar -cf "$work/dali.tar" -C "$work" wheels
rm -rf "$out"
mkdir -p "$out"
split -b 56M -d "$work/dali.tar" "$work/part-"
(cd "$work" && sha256sum dali.tar > SHA256SUMS)
count=0
for part in "$work"/part-*; do
    count=$((count + 1))
    mkdir -p "$out/$count"
    mv "$part" "$out/$count/part"
    cp "$work/SHA256SUMS" "$out/$count/"
done
echo "$count parts of at most 56 MiB in $out/ ($(du -sh "$work/dali.tar" | cut -f1) in all):"
for n in $(seq 1 "$count"); do echo "  carry $out/$n"; done
