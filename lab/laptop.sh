#!/usr/bin/env bash
# lab/laptop.sh: the laptop experiment (docs/laptop_experiment.md). Trains config/arith_laptop.py with each
# router and seed, at most JOBS runs at a time with one thread each, scores every run on held-out
# expressions, then prints the tables (per router, per seed pair, time per run) and, with
# matplotlib, every operator count's table and the figure.
#   bash lab/laptop.sh                              # 5 seeds x none, static, dynamic into out/laptop_arith/
#   SEEDS="1 2" ROUTERS="none static" bash lab/laptop.sh   # fewer runs
#   bash lab/laptop.sh --max_iters=500              # train.py overrides follow
# Environment: SEEDS, ROUTERS, JOBS (2), OUT (out/laptop_arith), DATA (data/arith), PREPARE_ARGS and
# EVAL_ARGS (extra keys for lab/arith.py's prepare and eval), CONFIG (config/arith_laptop.py).
# A run whose arith_eval.json exists is kept, so running the command again finishes an interrupted set
# (delete a half-trained run's directory first: train.py refuses to start over an existing run).
set -euo pipefail
SEEDS=${SEEDS:-1 2 3 4 5}
ROUTERS=${ROUTERS:-none static dynamic}
JOBS=${JOBS:-2}
OUT=${OUT:-out/laptop_arith}
DATA=${DATA:-data/arith}
CONFIG=${CONFIG:-config/arith_laptop.py}
export OMP_NUM_THREADS=1  # one core per run: on a busy machine a second thread mostly waits

if [ ! -f "$DATA/task.json" ]; then
    # shellcheck disable=SC2086  # PREPARE_ARGS is a list of --key=value words
    python -m lab.arith --mode=prepare --out_dir="$DATA" ${PREPARE_ARGS:-}
fi

one_run() {  # router seed [overrides]: train, then score; time.json: the training's wall and CPU seconds
    local r=$1 s=$2 d=$OUT/${1}_s$2
    shift 2
    local TIMEFORMAT='{"train_wall_s": %R, "train_cpu_s": %U}'  # bash's time: wall and user CPU seconds
    { time python train.py "$CONFIG" --router="$r" --seed="$s" --data_dir="$DATA" --out_dir="$d" "$@" \
        > "$d.train.txt" 2>&1; } 2> "$d.time.json"
    mv "$d.time.json" "$d/time.json"
    # shellcheck disable=SC2086
    python -m lab.arith --mode=eval --ckpt_dir="$d" ${EVAL_ARGS:-} > "$d.eval.txt" 2>&1
    echo "done: $d ($(cat "$d/time.json"))"
}

mkdir -p "$OUT"
for s in $SEEDS; do
    for r in $ROUTERS; do
        if [ -f "$OUT/${r}_s$s/arith_eval.json" ]; then
            echo "kept: $OUT/${r}_s$s"
            continue
        fi
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
        echo "start: $OUT/${r}_s$s"
        one_run "$r" "$s" "$@" &
    done
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || true; done
for r in $ROUTERS; do for s in $SEEDS; do  # a failed run stops here, with its log named
    [ -f "$OUT/${r}_s$s/arith_eval.json" ] || { echo "failed: $OUT/${r}_s$s, see $OUT/${r}_s$s.*.txt" >&2; exit 1; }
done; done

python - "$OUT" "$ROUTERS" "$SEEDS" <<'EOF'
# Each seed pair at the hardest operator count, and each run's training time.
import json, statistics, sys
out, routers, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
acc, wall = {}, {}
for r in routers:
    for s in seeds:
        result = json.load(open(f'{out}/{r}_s{s}/arith_eval.json'))
        k = max(result['accuracy'], key=int)  # held-out accuracy at the hardest operator count
        acc[r, s] = 100 * result['accuracy'][k]
        wall[r, s] = json.load(open(f'{out}/{r}_s{s}/time.json'))
def ms(values):
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"
print(f"\nheld-out exact match at {k} operators, %, by seed")
print('| seed | ' + ' | '.join(routers) + ' |\n|---|' + '---|' * len(routers))
for s in seeds:
    print(f'| {s} | ' + ' | '.join(f'{acc[r, s]:.1f}' for r in routers) + ' |')
print('| mean ± std | ' + ' | '.join(ms([acc[r, s] for s in seeds]) for r in routers) + ' |')
for key, name in (('train_wall_s', 'wall'), ('train_cpu_s', 'CPU')):
    print(f'| training, {name} minutes per run | '
          + ' | '.join(ms([wall[r, s][key] / 60 for s in seeds]) for r in routers) + ' |')
if 'none' in routers:
    for r in routers:
        if r != 'none':
            wins = sum(acc[r, s] > acc['none', s] for s in seeds)
            print(f"{r} beats none in {wins} of {len(seeds)} seed pairs")
EOF
runs=$(for r in $ROUTERS; do for s in $SEEDS; do printf '%s,' "$OUT/${r}_s$s"; done; done)
if python -c 'import matplotlib' 2>/dev/null; then  # every operator count's table, and the figure
    python -m lab.plot --mode=arith "--runs=${runs%,}" --out="$OUT/arith_accuracy.png"
else
    echo "no figure: matplotlib is not installed (pip install matplotlib); the tables above stand"
fi
