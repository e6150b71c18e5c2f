#!/usr/bin/env bash
# lab/laptop.sh: the laptop experiment (docs/laptop_experiment.md). Trains config/arith_laptop.py
# with each router and seed through lab/runs.py (at most JOBS at a time, one thread each; a
# finished run is kept and an interrupted one resumed, so the command again finishes a set),
# scores each on held-out expressions, then prints lab/plot.py's tables and draws its figure.
#   bash lab/laptop.sh                                     # 5 seeds x none, static, dynamic
#   SEEDS="1 2" ROUTERS="none static" bash lab/laptop.sh   # fewer runs
#   bash lab/laptop.sh --max_iters=500                     # train.py overrides follow
# Environment: SEEDS, ROUTERS, JOBS (2), OUT (out/laptop_arith), DATA (data/arith), CONFIG
# (config/arith_laptop.py), PREPARE_ARGS and EVAL_ARGS (lab/arith.py's prepare and eval keys).
set -euo pipefail
SEEDS=${SEEDS:-1 2 3 4 5}
ROUTERS=${ROUTERS:-none static dynamic}
OUT=${OUT:-out/laptop_arith}
DATA=${DATA:-data/arith}
CONFIG=${CONFIG:-config/arith_laptop.py}
if [ ! -f "$DATA/task.json" ]; then
    # shellcheck disable=SC2086  # PREPARE_ARGS is a list of --key=value words
    python -m lab.arith --mode=prepare --out_dir="$DATA" ${PREPARE_ARGS:-}
fi
runs=() dirs=
for s in $SEEDS; do
    for r in $ROUTERS; do
        runs+=("$OUT/${r}_s$s $CONFIG --router=$r --seed=$s --data_dir=$DATA $*")
        dirs+=$OUT/${r}_s$s,
    done
done
python -m lab.runs --jobs="${JOBS:-2}" --done=arith_eval.json \
    --then="python -m lab.arith --mode=eval --ckpt_dir={run} ${EVAL_ARGS:-}" "${runs[@]}"
python -m lab.plot --mode=arith "--runs=${dirs%,}" --out="$OUT/arith_accuracy.png"
