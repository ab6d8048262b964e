"""The thread count reaches TVM's pools as an argument, never through the environment."""

import json
import os
import subprocess
import sys

from korch_tvm.backend.target import parse_target, thread_count
from korch_tvm.config import KorchConfig
from korch_tvm.costing.session import CostingSession

TARGET = parse_target({"kind": "llvm", "num-cores": 2})
# Run in a worker process: the size of that process's TVM pool (a builtin is what pickles).
POOL_SIZE = "__import__('tvm').get_global_func('runtime.NumThreads')()"


def test_configuring_threads_sizes_the_pool_and_leaves_the_environment_alone():
    """In a fresh process (its pool not made yet) without TVM_NUM_THREADS: three threads,
    though TVM's default there is half the hardware threads, and os.environ as it was."""
    code = ("import json, os, tvm\n"
            "from korch_tvm.backend.target import configure_threads\n"
            "before = dict(os.environ)\n"
            "count = configure_threads(3)\n"
            "print(json.dumps([count, dict(os.environ) == before, eval(" + repr(POOL_SIZE) + ")]))\n")
    env = {name: value for name, value in os.environ.items() if name != "TVM_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    count, environment_unchanged, pool = json.loads(done.stdout.strip().splitlines()[-1])
    assert (count, environment_unchanged, pool) == (3, True, 3)


def test_the_thread_count_is_the_configs_else_the_users_variable(monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "5")
    assert thread_count(2) == 2 and thread_count(None) == 5
    monkeypatch.delenv("TVM_NUM_THREADS")
    assert thread_count(None) == len(os.sched_getaffinity(0))


def test_the_sessions_runner_worker_runs_on_the_configs_threads(tmp_path):
    """The count the config asks for, not the environment's (conftest sets it to the cores)."""
    before = dict(os.environ)
    config = KorchConfig(tuning_logs=str(tmp_path), target=TARGET, num_threads=3)
    with CostingSession.open(config) as session:
        runner = session.runner()
        assert session.threads == 3
        assert runner.pool.submit(eval, POOL_SIZE).result() == 3
    assert dict(os.environ) == before
