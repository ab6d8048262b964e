#!/usr/bin/env bash
# Prepare (on this machine, no GPU needed) what the GPU machine needs to run
# bench/cuda_device_check.py: it has Python 3.12, CUDA 13 and no network, but no TVM.
# The apache-tvm wheel (~100 MB) exceeds the device tool's 64 MiB per call, so it is split
# in two parts that travel in two calls (see bench/results/cuda-README.md):
#   .gpu/a/  tvm.part.aa                                   (call 1)
#   .gpu/b/  tvm.part.ab, apache-tvm-ffi, highspy wheels  (call 2)
# bench/models/{segformer_b0,yolox_nano}.onnx travel in call 3 (they are git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/whl
PIP="${PYTHON:-.venv/bin/python} -m pip"
$PIP download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/whl \
    apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post0 highspy
split -b 55M .gpu/whl/apache_tvm-0.27.0.post1-*.whl .gpu/a/tvm.part.
mv .gpu/a/tvm.part.ab .gpu/b/
basename .gpu/whl/apache_tvm-0.27.0.post1-*.whl > .gpu/b/tvm.name
mv .gpu/whl/apache_tvm_ffi-*.whl .gpu/whl/highspy-*.whl .gpu/b/
rm -rf .gpu/whl
du -sh .gpu/a .gpu/b
