"""The runtimes a benchmark times side by side, each opened the same way wherever it is timed.

TVM libraries (Relax VM), ONNX Runtime and OpenVINO all read the model's inputs from
`model_inputs`, run on the same thread count, and are turned into argument-less callables by
`engine_runners`, which `bench_stats.interleaved_samples` times in rounds. The settings of each
foreign runtime are stated by `ort_settings` / `openvino_settings`, so that every result names
them. `korch-tvm bench` and bench/run_zoo.py use these, so their numbers mean the same.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

OPENVINO_MISSING = ("OpenVINO is not installed: `.venv/bin/pip install -e '.[openvino]'` adds it "
                    "(or pass --no-openvino); timing the other runtimes")


def cores() -> int:
    """Cores this process may run on (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def model_inputs(model: str, input_shapes=None) -> dict:
    """Seeded random inputs {name: numpy array} for the ONNX file `model`; `input_shapes`
    ({name: dims}) fixes dynamic dimensions."""
    from ..backend.verify import random_inputs
    from ..frontend.onnx_import import input_dtypes, load_onnx
    from ..frontend.onnx_import import input_shapes as onnx_input_shapes

    proto = load_onnx(model)
    return random_inputs(onnx_input_shapes(proto, input_shapes or None), input_dtypes(proto))


# ----------------------------------------------------------------------------- TVM
class quiet_stderr:
    """Silence file descriptor 2 (native warnings) for the duration of a `with` block."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        return False


def tvm_arguments(inputs: Mapping):
    """The inputs as TVM tensors on the CPU, in the model's input order."""
    import numpy as np
    import tvm

    device = tvm.cpu(0)
    return [tvm.runtime.tensor(np.asarray(x), device) for x in inputs.values()]


def tvm_machines(libraries: Mapping[str, str]) -> dict:
    """{name: relax.VirtualMachine} for each exported library path."""
    import tvm
    from tvm import relax

    machines = {}
    for name, library in libraries.items():
        with quiet_stderr():  # TVM warns once per loaded library scope ("Scope Loaded")
            machines[name] = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu(0))
    return machines


# ----------------------------------------------------------------------------- ONNX Runtime
def ort_available() -> bool:
    """Whether onnxruntime is installed."""
    from ..backend.verify import import_onnxruntime

    return import_onnxruntime() is not None


def ort_version() -> str | None:
    """onnxruntime's version, or None when it is not installed."""
    from ..backend.verify import import_onnxruntime

    onnxruntime = import_onnxruntime()
    return None if onnxruntime is None else onnxruntime.__version__


def ort_settings(threads: int | None) -> dict:
    """What `ort_session` sets, as the result states it."""
    return {"provider": "CPUExecutionProvider", "intra_op_num_threads": int(threads or cores()),
            "inter_op_num_threads": 1, "execution_mode": "ORT_SEQUENTIAL",
            "graph_optimization_level": "ORT_ENABLE_ALL"}


def ort_session(model_path: str, threads: int | None, options=None):
    """An ONNX Runtime CPU session of `model_path` on `threads` threads (default: every core);
    `options`: SessionOptions to start from (the profiler sets some)."""
    from ..backend.verify import import_onnxruntime

    onnxruntime = import_onnxruntime()  # telemetry off: nothing written under the home folder
    options = options or onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(threads or cores())
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


# ----------------------------------------------------------------------------- OpenVINO
def import_openvino():
    """The `openvino` module, or None when it is not installed."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino


def openvino_version() -> str | None:
    """The installed openvino release (e.g. 2026.4.1), or None when it is not installed."""
    from importlib import metadata

    openvino = import_openvino()
    if openvino is None:
        return None
    try:
        return metadata.version("openvino")
    except metadata.PackageNotFoundError:  # a build from source: its own long version
        return openvino.__version__


def openvino_settings(threads: int | None) -> dict:
    """What `openvino_model` sets, as the result states it: CPU, the thread count TVM and ORT
    get, the latency hint, float32 inference."""
    return {"device": "CPU", "INFERENCE_NUM_THREADS": int(threads or cores()),
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}


def openvino_model(model_path: str, threads: int | None, inputs: Mapping):
    """OpenVINO's compiled model of the ONNX file `model_path`, reshaped to the shapes of
    `inputs` (so dynamic dimensions are fixed as for the other runtimes), with
    `openvino_settings(threads)`."""
    openvino = import_openvino()
    core = openvino.Core()
    network = core.read_model(model_path)
    network.reshape({name: openvino.PartialShape(list(value.shape))
                     for name, value in inputs.items()})
    settings = openvino_settings(threads)
    config = {key: value for key, value in settings.items() if key != "device"}
    return core.compile_model(network, settings["device"], config)


def openvino_runner(compiled, inputs: Mapping) -> Callable[[], list]:
    """A call of `compiled` on `inputs` returning its outputs as numpy arrays, in order.

    One infer request, reused: what a latency-bound application does."""
    request = compiled.create_infer_request()
    feed = dict(inputs)

    def run():
        request.infer(feed)
        return [request.get_output_tensor(index).data.copy()
                for index in range(len(compiled.outputs))]
    return run


# ----------------------------------------------------------------------------- all together
def engine_runners(model: str, libraries: Mapping[str, str], inputs: Mapping,
                   threads: int | None, *, with_ort: bool = True,
                   with_openvino: bool = False) -> dict[str, Callable[[], object]]:
    """{name: argument-less call} for each library (a Relax VM each), ONNX Runtime (as
    "onnxruntime") and OpenVINO (as "openvino"), in that order, all on the same `inputs`."""
    args = tvm_arguments(inputs)
    machines = tvm_machines(libraries)
    runners = {name: (lambda main=machine["main"]: main(*args))
               for name, machine in machines.items()}
    if with_ort:
        session = ort_session(model, threads)
        runners["onnxruntime"] = lambda: session.run(None, dict(inputs))
    if with_openvino:
        runners["openvino"] = openvino_runner(openvino_model(model, threads, inputs), inputs)
    return runners


def openvino_verification(model: str, inputs: Mapping, threads: int | None,
                          tolerance: float | None = None) -> dict:
    """OpenVINO's outputs against ONNX Runtime's on `inputs`, as `verify.compare` judges them
    (`tolerance` None: by each output's dtype, as a compile's verification)."""
    from ..backend.verify import compare

    expected = ort_session(model, threads).run(None, dict(inputs))
    actual = openvino_runner(openvino_model(model, threads, inputs), inputs)()
    return compare(actual, expected, "onnxruntime", tolerance=tolerance).as_dict()
