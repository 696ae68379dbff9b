#!/usr/bin/env bash
# Packs, on a build machine, what the GPU check (benches/gpu/run.sh) needs on a GPU machine that
# has Python, torch and CUDA but no Rust: the stripped release wheel of the Python package and
# the stripped, gzipped `stoker`, `stoker-worker` and `stoker-lane-helper` binaries, in `.device/` at the repository
# root (ignored by git). Run from anywhere; uses the release build cache and `.venv`'s maturin
# (made by `./dev test`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=.device
rm -rf "$out"
mkdir -p "$out"
if ! grep -qx '/.device/' .git/info/exclude 2>/dev/null; then
    echo '/.device/' >> .git/info/exclude
fi
cargo build --release -p stoker-cli -p stoker-worker-daemon -p stoker-lane-helper --bins --quiet
for name in stoker stoker-worker stoker-lane-helper; do
    strip -o "$out/$name" "target/release/$name"
    gzip -9 "$out/$name"
done
maturin=.venv/bin/maturin
[ -x "$maturin" ] || maturin=maturin
(cd python-client && "../$maturin" build --release --strip --quiet --out "../$out" 2>&1 | grep -v '^📦\|^🔗\|^🐍' || true)
ls "$out"/*.whl >/dev/null
du -ch "$out"/* | tail -1
