#!/bin/bash
# usage (from the repository): ab.sh MODEL TAG PYTHONPATH [OUT=/tmp/prof/ab]: one cold compile of bench/zoo/models/MODEL.onnx
# into a fresh log with the korch_tvm at PYTHONPATH; appends its wall seconds to OUT/summary.txt.
m=$1; tag=$2; pp=$3; out=${4:-/tmp/prof/ab}; repo=$(git rev-parse --show-toplevel)
d=$out/$m-$tag; rm -rf "$d"; mkdir -p "$d"
cd "$d" || exit 1
start=$(date +%s.%N)
PYTHONPATH=$pp "$repo/.venv/bin/korch-tvm" compile "$repo/bench/zoo/models/$m.onnx" --korch --trials 0 \
    --no-verify --tuning-logs "$d/logs" -o "$d/out.so" --report "$d/report.json" -v > "$d/log.txt" 2>&1
echo "$m $tag rc=$? wall=$(echo "$(date +%s.%N) - $start" | bc)" | tee -a "$out/summary.txt"
