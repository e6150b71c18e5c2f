#!/usr/bin/env bash
# lab/compare.sh: train one config with each router in turn, then draw their loss curves.
#   bash lab/compare.sh config/small_text.py                 # into out/small_text/{none,static,dynamic}
#   bash lab/compare.sh config/small_text.py --max_iters=350 # train.py overrides follow the config
# A run that exists is refused, as train.py refuses it: add --init_from=resume to finish an
# interrupted comparison (a router that saved no checkpoint yet starts from scratch), or
# --overwrite=True to start it again.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1" ]; then
    echo "usage: bash lab/compare.sh CONFIG_FILE [--key=value ...]" >&2
    exit 2
fi
config=$1
shift
out=out/$(basename "$config" .py)  # out/small_text for config/small_text.py
resume=no
for arg in "$@"; do  # an --out_dir given here is used instead
    case $arg in
        --out_dir=*) out=${arg#--out_dir=} ;;
        --init_from=resume) resume=yes ;;
    esac
done
for router in none static dynamic; do
    echo "== router=$router: $out/$router"
    args=("$@")
    if [ $resume = yes ] && [ ! -f "$out/$router/ckpt.pt" ]; then
        # Never saved a checkpoint (or never started): nothing to resume, at most a log to replace.
        args=()
        for arg in "$@"; do [ "$arg" = --init_from=resume ] || args+=("$arg"); done
        args+=(--overwrite=True)
    fi
    python train.py "$config" ${args[@]+"${args[@]}"} --router=$router --out_dir="$out/$router"
done
python -m lab.plot --runs="$out/none,$out/static,$out/dynamic" --out="$out/loss_curves.png"
