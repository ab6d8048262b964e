#!/bin/bash
# cold compiles: name, model, code dir
run() {
  name=$1; model=$2; code=$3
  rm -rf /tmp/ct/$name; mkdir -p /tmp/ct/$name
  export KORCH_TVM_CACHE_DIR=/tmp/ct/$name/cache TVM_NUM_THREADS=2
  start=$(date +%s.%N)
  PYTHONPATH=$code/python /usr/bin/time -f "%e s wall %U user %S sys" /work/main/.venv/bin/korch-tvm compile /work/main/bench/zoo/models/$model.onnx --target llvm --korch --trials 0 --no-verify -o /tmp/ct/$name/out.so --report /tmp/ct/$name/report.json > /tmp/ct/$name/compile.log 2>&1
  echo "$name $(tail -1 /tmp/ct/$name/compile.log) load $(cut -d' ' -f1 /proc/loadavg)"
}
run dn-after densenet121 /work/main
run ssd-base ssdlite320_head /tmp/base
run ssd-after ssdlite320_head /work/main
