#!/usr/bin/env bash
# lab/compare.sh: train one config with each router in turn (lab/runs.py: a finished run is kept
# and an interrupted one resumed), then draw their loss curves.
#   bash lab/compare.sh config/small_text.py                 # into out/small_text/{none,static,dynamic}
#   bash lab/compare.sh config/small_text.py --max_iters=350 # train.py overrides follow the config
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1" ]; then
    echo "usage: bash lab/compare.sh CONFIG_FILE [--key=value ...]" >&2
    exit 2
fi
config=$1
shift
out=${OUT:-out/$(basename "$config" .py)}  # out/small_text for config/small_text.py
python -m lab.runs --jobs=1 "$out/none $config --router=none $*" \
    "$out/static $config --router=static $*" "$out/dynamic $config --router=dynamic $*"
python -m lab.plot --runs="$out/none,$out/static,$out/dynamic" --out="$out/loss_curves.png"
