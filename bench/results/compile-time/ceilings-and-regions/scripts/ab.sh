#!/bin/bash
# usage: ab.sh MODEL TAG PYTHONPATH
m=$1; tag=$2; pp=$3
d=/tmp/prof/ab/$m-$tag; rm -rf $d; mkdir -p $d
cd $d
start=$(date +%s.%N)
PYTHONPATH=$pp /work/main/.venv/bin/korch-tvm compile /work/main/bench/zoo/models/$m.onnx --korch --trials 0 --no-verify --tuning-logs $d/logs -o $d/out.so --report $d/report.json -v > $d/log.txt 2>&1
echo "$m $tag rc=$? wall=$(echo "$(date +%s.%N) - $start" | bc)" | tee -a /tmp/prof/ab/summary.txt
