# Sourced by the GPU scripts (run.sh, decode_check.sh, lane_levers.sh) from the repository
# root on the GPU machine: installs the wheel and binaries benches/gpu/pack.sh put in
# `.device/` (the package under $site on PYTHONPATH, the binaries in $bin, named by
# STOKER_BIN_DIR), makes $out, writes the machine's GPU, cores and versions to
# $out/machine.log, and makes the 10,000-image set at $data (a complete one is kept, an
# interrupted one finished). Defines `step_done`: the scripts exit with their first failed
# step's status, not tee's.
# Under SCRATCH (default /tmp): the package, the binaries and the image set.
scratch="${SCRATCH:-/tmp}"
out="${OUT:-$scratch/stoker-gpu-out}"
site=$scratch/stoker-site
bin=$scratch/stoker-bin
data=$scratch/stoker-gpu-bench-data
mkdir -p "$out" "$bin"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .device/*.whl || exit 1
export PYTHONPATH="$site" STOKER_BIN_DIR="$bin"
for name in stoker stoker-worker stoker-lane-helper; do
    gunzip -c ".device/$name.gz" > "$bin/$name" && chmod +x "$bin/$name" || exit 1
done
# Called right after a step's pipeline as `step_done "${PIPESTATUS[0]}" what`: a step's output
# goes through tee, whose own status would hide its failure. The first failure's status is the
# script's (`exit "$failed"`), each failure also in $out/failed.log.
failed=0
step_done() {
    local rc=$1
    shift
    if [ "$rc" -ne 0 ]; then
        echo "FAILED (exit $rc): $*" | tee -a "$out/failed.log"
        [ "$failed" -ne 0 ] || failed=$rc
    fi
}
{ nvidia-smi -L; nproc; python3 -c 'import torch, stoker; print("torch", torch.__version__, "cuda", torch.version.cuda, "stoker", stoker.__version__)'; } 2>&1 | tee "$out/machine.log"
made=$SECONDS
"$bin/stoker" make-dataset --out "$data" --count 10000 2>&1 | tail -1
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "make-dataset failed: no image set to measure on"; exit 1; }
echo "data ready in $((SECONDS - made)) s"
# DALI, when benches/gpu/pack_dali.sh's parts were all carried here: joined in order, checked
# against their sum, installed beside the wheel (without it the DALI rows say so and are skipped),
# once per packed tar while the machine stays warm (a stamp in $site says it is there). No
# LD_LIBRARY_PATH is set for it: DALI's and nvImageCodec's libraries search /usr/local/cuda/lib64
# (the toolkit's nvJPEG, NPP, cuFFT) in their own RUNPATH, and setting it would put the
# toolkit's CUDA libraries before torch's own for every row of the run.
if [ -d .device-dali ]; then
    joined=/tmp/stoker-dali.tar
    parts=$(find .device-dali -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -n)
    first=$(echo "$parts" | head -1)
    want=$(cut -d' ' -f1 ".device-dali/$first/SHA256SUMS")
    if [ -e "$site/.dali-$want" ]; then
        echo "DALI already installed from these parts" | tee -a "$out/machine.log"
    elif for n in $parts; do cat ".device-dali/$n/part"; done > "$joined" \
        && [ "$(sha256sum "$joined" | cut -d' ' -f1)" = "$want" ]; then
        rm -rf /tmp/stoker-dali && mkdir -p /tmp/stoker-dali && tar -xf "$joined" -C /tmp/stoker-dali
        python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
            /tmp/stoker-dali/wheels/*.whl \
            && touch "$site/.dali-$want" \
            && echo "DALI installed from $(echo "$parts" | wc -l) parts" | tee -a "$out/machine.log"
    else
        echo "DALI: the parts in .device-dali/ do not join to the packed tar (not all carried?); DALI rows skip" | tee -a "$out/machine.log"
    fi
    rm -f "$joined"
fi
