#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, after bench/cuda_device_prep.sh's .gpu/a
# and .gpu/b have been carried there: installs TVM into /tmp/site, then runs the device check.
# Results and CUDA tuning logs go to $OUT (default out/cuda_check). Extra args go to the check.
set -uo pipefail
OUT="${OUT:-out/cuda_check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
cat .gpu/a/tvm.part.* .gpu/b/tvm.part.* > "/tmp/$(cat .gpu/b/tvm.name)" || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "/tmp/$(cat .gpu/b/tvm.name)" .gpu/b/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD/python PYTHONUNBUFFERED=1
# TVM's CUDA runtime needs libcudart.so.13 and the driver's libcuda.so.1 on the loader path.
for d in /usr/local/nvidia/lib64 /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         "$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0] if hasattr(nvidia, "__path__") else ""))' 2>/dev/null)/nvidia/cu13/lib"; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python3 -c "import tvm; print('tvm', tvm.__version__, 'cuda runtime', tvm.runtime.enabled('cuda'), 'device', tvm.cuda(0).exist)"
python3 bench/cuda_device_check.py --out "$OUT" --logs "$OUT/logs" "$@"
status=$?
# the check copied the logs to $OUT/tuning_logs/<tag>/ (two folders down: what comes back);
# files come back only up to 16 MB each, so a larger log file comes back gzipped
rm -rf "$OUT/logs"
for f in "$OUT"/tuning_logs/*/*.json; do
    [ -f "$f" ] && [ "$(stat -c%s "$f")" -gt 15000000 ] && gzip -9 "$f"
done
exit $status
