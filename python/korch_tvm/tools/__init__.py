"""The korch-tvm command line: compile, tune, explain, bench, run, logs."""
