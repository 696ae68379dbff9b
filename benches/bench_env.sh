# Shared by compare_torch.sh, compare_loader.sh, compare_dataset.sh and compare_tokens.sh (sourced, not run): parses --count / --data
# (everything else is kept in `passthrough` for the Python script), makes a relative --data
# absolute, and makes sure the bench venv has torch, torchvision, pillow and numpy.
# Expects `usage_lines` (the line range of the caller's header to print for --help).
# Sets: repo, venv, count, data, passthrough; image_set sets data for the image comparisons, and
# run_image_comparison runs one of them.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${STOKER_BENCH_VENV:-$repo/.venv-bench}"

count=""
data=""
passthrough=()
while (($# > 0)); do
    case "$1" in
        --count)
            count="${2:?--count needs a number}"
            shift 2
            ;;
        --data)
            data="${2:?--data needs a folder}"
            shift 2
            ;;
        -h | --help)
            sed -n "${usage_lines}p" "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            passthrough+=("$1")
            shift
            ;;
    esac
done

# The callers move to the repo root; a relative --data means the caller's folder.
if [[ -n "$data" && "$data" != /* ]]; then
    data="$PWD/$data"
fi

# Progress goes to stderr throughout so that `--json` leaves stdout to the one JSON object.
if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating venv $venv" >&2
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import numpy, PIL, torch, torchvision' 2>/dev/null; then
    echo "installing torch, torchvision, pillow, numpy into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet torch torchvision pillow numpy >&2
fi

# Builds ./python-client into the venv (release) unless STOKER_BENCH_SKIP_INSTALL=1 and it is
# already there; moves to the repo root.
install_stoker() {
    cd "$repo"
    if [[ "${STOKER_BENCH_SKIP_INSTALL:-0}" != 1 ]] || ! "$venv/bin/python" -c 'import stoker' 2>/dev/null; then
        echo "building and installing ./python-client into $venv (release profile)" >&2
        "$venv/bin/python" -m pip install --quiet ./python-client >&2
    fi
}

# Where generated bench data lives: <target>/bench-data, honouring CARGO_TARGET_DIR and
# .cargo/config overrides instead of assuming ./target.
bench_data_dir() {
    local target_dir
    target_dir="$(cargo metadata --format-version 1 --no-deps |
        "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    echo "$target_dir/bench-data"
}

# Sets `data` to the ImageNet-like set the Python comparisons read: with --count N (or no --data)
# N images (default $1) are generated once in --data or under bench_data_dir, then reused;
# --data alone is used as it is. Needs install_stoker first.
image_set() {
    if [[ -z "$data" || -n "$count" ]]; then
        count="${count:-$1}"
        data="${data:-$(bench_data_dir)/imagenet-like-$count}"
        echo "making (or reusing) $count images in $data" >&2
        data="$("$venv/bin/python" -c 'import sys; from stoker._native import make_dataset; print(make_dataset(sys.argv[1], int(sys.argv[2])))' "$data" "$count")"
    fi
}

# The image comparisons' whole run: installs stoker, makes (or reuses) the image set of $1
# images by default, and replaces this shell with benches/$2 on it.
run_image_comparison() {
    install_stoker
    image_set "$1"
    exec "$venv/bin/python" "$repo/benches/$2" --data "$data" ${passthrough[@]+"${passthrough[@]}"}
}
