#!/usr/bin/env bash
# lab/depth_text.sh: the paper's depth claim on text, on a CPU (docs/results.md). Trains
# config/depth_text.py (byte-level Python docs) with each router, depth and seed, at most JOBS runs
# at a time with one thread each, then prints the final validation losses (per seed pair) and, with
# matplotlib, draws the loss curves by step and by FLOPs.
#   bash lab/depth_text.sh                                  # 8 and 32 layers x none, static x 3 seeds
#   DEPTHS="2" SEEDS="1" bash lab/depth_text.sh --max_iters=4   # a tiny run (the test's)
# Environment: DEPTHS, ROUTERS, SEEDS, JOBS (2), OUT (out/depth_text), DATA (data/pydoc_bytes),
# CONFIG (config/depth_text.py). A finished run (its ckpt.pt at max_iters) is kept, so running the
# command again finishes an interrupted set; train.py's overrides follow the command.
set -euo pipefail
DEPTHS=${DEPTHS:-8 32}
ROUTERS=${ROUTERS:-none static}
SEEDS=${SEEDS:-1 2 3}
JOBS=${JOBS:-2}
OUT=${OUT:-out/depth_text}
DATA=${DATA:-data/pydoc_bytes}
CONFIG=${CONFIG:-config/depth_text.py}
export OMP_NUM_THREADS=1  # one core per run: on a busy machine a second thread mostly waits

if [ ! -d "$DATA" ]; then
    python prepare.py --tokenizer=bytes --out_dir="$DATA"
fi

one_run() {  # depth router seed [overrides]
    local d=$OUT/L$1_$2_s$3 depth=$1 router=$2 seed=$3
    shift 3
    if python train.py "$CONFIG" --n_layer="$depth" --router="$router" --seed="$seed" \
        --data_dir="$DATA" --out_dir="$d" --overwrite=True "$@" > "$d.train.txt" 2>&1; then
        echo "done: $d"
    else
        echo "failed: $d, see $d.train.txt" >&2
        return 1
    fi
}

mkdir -p "$OUT"
for L in $DEPTHS; do for s in $SEEDS; do for r in $ROUTERS; do
    if grep -qs '"final": true' "$OUT/L${L}_${r}_s$s/done.json"; then
        echo "kept: $OUT/L${L}_${r}_s$s"
        continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    echo "start: $OUT/L${L}_${r}_s$s"
    (one_run "$L" "$r" "$s" "$@" && echo '{"final": true}' > "$OUT/L${L}_${r}_s$s/done.json") &
done; done; done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || true; done
for L in $DEPTHS; do for s in $SEEDS; do for r in $ROUTERS; do  # a failed run stops here
    [ -f "$OUT/L${L}_${r}_s$s/done.json" ] || { echo "failed: $OUT/L${L}_${r}_s$s" >&2; exit 1; }
done; done; done

python - "$OUT" "$DEPTHS" "$ROUTERS" "$SEEDS" <<'PY'
# The last validation loss of each run, by depth and seed, and who wins each seed pair.
import json, statistics, sys
out, depths, routers, seeds = sys.argv[1], *(a.split() for a in sys.argv[2:])
def final(run):
    records = [json.loads(line) for line in open(f'{out}/{run}/log.txt')][1:]
    val = [r for r in records if 'val_loss' in r]
    return val[-1]['val_loss'], val[-1].get('val_bpb')
for L in depths:
    loss = {(r, s): final(f'L{L}_{r}_s{s}') for r in routers for s in seeds}
    bpb = all(v[1] is not None for v in loss.values())
    print(f"\n{L} layers: final validation loss" + (" (bits per byte)" if bpb else ""))
    print('| seed | ' + ' | '.join(routers) + ' |\n|---|' + '---|' * len(routers))
    for s in seeds:
        print(f'| {s} | ' + ' | '.join(f'{loss[r, s][0]:.4f}' + (f' ({loss[r, s][1]:.4f})' if bpb else '')
                                      for r in routers) + ' |')
    if len(seeds) > 1:
        print('| mean ± std | ' + ' | '.join(
            f"{statistics.mean(loss[r, s][0] for s in seeds):.4f} ± "
            f"{statistics.stdev(loss[r, s][0] for s in seeds):.4f}" for r in routers) + ' |')
    for r in routers:
        if r != 'none' and 'none' in routers:
            wins = sum(loss[r, s][0] < loss['none', s][0] for s in seeds)
            print(f"{L} layers: {r} below none in {wins} of {len(seeds)} seed pairs")
PY
runs=$(for L in $DEPTHS; do for r in $ROUTERS; do for s in $SEEDS; do
    printf '%s,' "$OUT/L${L}_${r}_s$s"; done; done; done)
if python -c 'import matplotlib' 2>/dev/null; then
    python -m lab.plot "--runs=${runs%,}" --out="$OUT/loss_curves.png"
else
    echo "no figure: matplotlib is not installed (pip install matplotlib); the tables above stand"
fi
