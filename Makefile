# The two commands a user types on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_MODEL := models/bert_layer.onnx
NPROC := $(shell nproc 2>/dev/null || echo 2)
export TVM_NUM_THREADS ?= $(NPROC)

.PHONY: install demo test bench bench-models clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/korch-tvm compile $(DEMO_MODEL) --target llvm --korch \
	    --tuning-logs tuning_logs --trials 0 -o out/demo.so --report out/demo_report.json

test: $(STAMP)
	$(PY) -m pytest -q tests

# Optional: the benchmark-model environment (torch, timm, transformers, yolox); never needed by `make test`.
bench-models:
	$(MAKE) -C bench models

bench: $(STAMP)
	$(PY) bench/run_suite.py

clean:
	rm -rf $(VENV) out .pytest_cache
