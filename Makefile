# The two commands a user types on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_MODEL := models/bert_layer.onnx
NPROC := $(shell nproc 2>/dev/null || echo 2)
export TVM_NUM_THREADS ?= $(NPROC)

.PHONY: install library demo test logs bench bench-models clean

install: $(STAMP) library

# The library kernels (OpenBLAS GEMMs) are built into the venv with the machine's C++ compiler;
# without one korch_tvm works as before, minus those kernels (the build says why in one line).
library: $(STAMP)
	$(PY) -m korch_tvm.library.build || echo "korch_tvm: continuing without library kernels"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,plot,openvino]'
	touch $(STAMP)

# The demo writes nothing in the repository but out/: its measurements go to the user's cache
# (korch-tvm's default log root; the shipped tuning_logs/ only seed it), so that a later
# `make test` never takes them for shipped logs.
demo: $(STAMP)
	mkdir -p out
	$(VENV)/bin/korch-tvm compile $(DEMO_MODEL) --target llvm --korch \
	    --trials 0 --measure -o out/demo.so --report out/demo_report.json

test: $(STAMP)
	$(PY) -m pytest -q tests

# Regenerate the shipped tuning logs for the bundled models on this machine (start from an empty
# tuning_logs/<tag>/ to drop records of kernels no longer built): default-schedule measurements
# of what both paths need, a cost model trained on them, then each trial budget in turn for the
# stock and the Korch path (the shipped log: 64, then 256; about 7 minutes here). Timed cold,
# every model alike, as the shipped llvm-<cpu>-<n>c logs are (an -l3 log takes them as seeds).
LOG_MODELS := models/bert_layer.onnx models/segformer_block.onnx
LOG_TRIALS ?= 64 256
LOG_FLAGS := --tuning-logs tuning_logs --cache-state cold
logs: $(STAMP)
	for m in $(LOG_MODELS); do \
	  $(VENV)/bin/korch-tvm compile $$m $(LOG_FLAGS) --trials 0 -q --no-verify && \
	  $(VENV)/bin/korch-tvm compile $$m --korch $(LOG_FLAGS) --trials 0 -q --no-verify \
	  || exit 1; done
	$(VENV)/bin/korch-tvm logs tuning_logs --train
	for t in $(LOG_TRIALS); do for m in $(LOG_MODELS); do \
	  $(VENV)/bin/korch-tvm compile $$m $(LOG_FLAGS) --trials $$t && \
	  $(VENV)/bin/korch-tvm compile $$m --korch $(LOG_FLAGS) --trials $$t \
	  || exit 1; done; done

# Optional: the benchmark-model environment (torch, timm, transformers, yolox); never needed by `make test`.
bench-models:
	$(MAKE) -C bench models

bench: $(STAMP)
	$(PY) bench/run_suite.py

clean:
	rm -rf $(VENV) out .pytest_cache
