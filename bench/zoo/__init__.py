"""The model zoo: real architectures built offline for `bench/run_zoo.py` (see registry.py)."""
