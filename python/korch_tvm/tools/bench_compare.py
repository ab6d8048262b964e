"""Compile stock and Korch, then time them with ONNX Runtime and OpenVINO: the benchmark itself.

`bench_model` runs the protocol that tools/bench.py describes (cold and warm compiles in child
processes, inference memory, interleaved timing, the kernel-kind profile, the floor) and returns
one JSON-friendly result; `retime` times the libraries an earlier run kept again. The pieces it
uses live beside it: engines.py (the runtimes), bench_stats.py (the arithmetic), bench_floor.py
(the floor), bench_workers.py (the child processes).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from . import engines
from .bench_floor import floor_report, machine_info, model_work
from .bench_stats import TimingProtocol, paired_ratio, summarize_samples, time_interleaved
from .bench_summary import compile_summary, load_json, write_json
from .bench_workers import run_child

PATHS = ("stock", "korch")


@dataclass(frozen=True)
class Runtimes:
    """What is timed and how each runtime is opened: the ONNX `model`, `input_shapes`
    ({name: dims} for dynamic inputs), `threads` for every runtime, and which foreign runtimes
    join the TVM libraries (each only when installed)."""

    model: str
    input_shapes: dict | None = None
    threads: int | None = None
    with_ort: bool = True
    with_openvino: bool = True

    def available(self, log=None) -> "Runtimes":
        """These runtimes less the ones not installed (OpenVINO's absence said once, by `log`)."""
        with_openvino = self.with_openvino and engines.import_openvino() is not None
        if self.with_openvino and not with_openvino and log:
            log(engines.OPENVINO_MISSING)
        return replace(self, with_ort=self.with_ort and engines.ort_available(),
                       with_openvino=with_openvino)

    def foreign(self) -> tuple[str, ...]:
        """The foreign runtimes' names, in timing order."""
        return (("onnxruntime",) if self.with_ort else ()) + (
            ("openvino",) if self.with_openvino else ())


def bench_model(model: str, settings: Mapping | None = None, *, input_shapes=None,
                timing: TimingProtocol = TimingProtocol(), with_ort: bool = True,
                with_openvino: bool = True, warm: bool = True, memory: bool = True,
                machine=None, reports_dir=None, log=None, calibrate: bool = False) -> dict:
    """Compile `model` stock and Korch (cold, then warm), then time them with ONNX Runtime and
    OpenVINO.

    `settings`: KorchConfig fields of both compiles (`flags.config_values`; a raw target spec
    is fine, each child resolves it); its `tuning_logs` None means a fresh temporary log.
    `input_shapes`: {name: dims}; `timing`: the TimingProtocol; `with_ort` / `with_openvino`:
    time those runtimes too (each only when installed); `warm`: also compile again from the
    filled log and time those; `memory`: measure each runtime's inference memory in a child;
    `machine`: bench/floor.py's facts for the floor; `reports_dir`: keep each compile's report
    and library there; `log`: a callable taking progress lines; `calibrate`: keep in-model /
    isolated ratios in the log.
    """
    from ..backend.target import configure_threads
    from ..config import KorchConfig

    log = log or (lambda message: None)
    settings = dict(settings or {})
    settings["num_threads"] = configure_threads(settings.get("num_threads"))
    config = KorchConfig(**settings)  # validated here, before minutes of compiling
    runtimes = Runtimes(model, input_shapes or None, settings["num_threads"], with_ort,
                        with_openvino)
    scratch = tempfile.mkdtemp(prefix="korch-bench-")
    try:
        if settings.get("tuning_logs") is None:
            settings["tuning_logs"] = os.path.join(scratch, "logs")
        settings["tuning_logs"] = os.path.abspath(settings["tuning_logs"])
        result = _new_result(config, settings, runtimes, timing, warm)
        libraries, reports = _compile_both(result, settings, runtimes, warm,
                                           reports_dir or scratch, reports_dir, log)
        runtimes = runtimes.available(log)
        if memory:
            _memory_into(result, runtimes, libraries, log)
        log(f"timing: {timing.repeat} interleaved rounds ...")
        _time_into(result, runtimes, libraries, timing)
        log("profile by kernel kind ...")
        rows = _profile_into(result, runtimes, libraries, reports)
        if calibrate:
            _calibrate(result, rows, config, settings["tuning_logs"], model, log,
                       (reports["korch"].get("cache_state") or {}).get("state", "cold"))
        from ..pipeline.compile import _load_source

        source = _load_source(os.path.abspath(model), input_shapes)
        result["work"] = model_work(source.relax_module)
        _add_floor(result, machine)
        return result
    finally:  # libraries (unless kept in reports_dir) and a throw-away log
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def _new_result(config, settings: Mapping, runtimes: Runtimes, timing: TimingProtocol,
                warm: bool) -> dict:
    """The result's header: what ran where, with which budget, settings and protocol."""
    import tvm

    from ..backend.target import target_tag

    return {
        "model": os.path.basename(runtimes.model),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_info(),
        "tvm_version": tvm.__version__,
        "onnxruntime_version": engines.ort_version(),
        "openvino_version": engines.openvino_version(),
        "target": str(config.target),
        "target_tag": target_tag(config.target),
        "threads": runtimes.threads,
        "trials_budget": config.trials,
        "trials_per_kernel": config.trials_per_kernel,
        "time_budget": config.time_budget,
        "fast_math": config.fast_math,
        "layout": config.layout,
        "tuning_logs": settings["tuning_logs"],
        "protocol": {**timing.as_dict(),
                     "order": "stock, korch, onnxruntime, openvino per round",
                     "timed_libraries": "warm" if warm else "cold"},
    }


def _compile_both(result: dict, settings: Mapping, runtimes: Runtimes, warm: bool, keep: str,
                  reports_dir, log) -> tuple[dict, dict]:
    """Compile stock then Korch, cold (and warm), each in a child; the compile summaries go into
    `result`. Returns (library path, compile report) per path, of the last phase."""
    os.makedirs(keep, exist_ok=True)
    stem = os.path.splitext(os.path.basename(runtimes.model))[0]
    phases = [("cold", False)] + ([("warm", True)] if warm else [])
    compiles: dict[str, dict] = {path: {} for path in PATHS}
    libraries, reports = {}, {}
    for phase, verify in phases:
        for path in PATHS:
            library = os.path.join(keep, f"{stem}.{path}.{phase}.so")
            budget = settings.get("trials", 0) if settings.get("trials_per_kernel") is None \
                else f"{settings['trials_per_kernel']}/kernel"
            log(f"compile {path} ({phase}, trials {budget}) ...")
            config = dict(settings)
            if path == "stock":
                config.pop("prune_margin", None)  # Korch's knob
            answer = run_child({"kind": "compile", "model": os.path.abspath(runtimes.model),
                                "korch": path == "korch", "verify": verify, "config": config,
                                "input_shapes": runtimes.input_shapes, "library": library}, log)
            report = answer.pop("report")
            if reports_dir:
                write_json(os.path.join(reports_dir, f"{stem}.{path}.{phase}.json"), report)
            compiles[path][phase] = {**compile_summary(report), **answer}
            reports[path], libraries[path] = report, library
            log(f"  {path} {phase}: {report['compile_seconds']:.1f} s, "
                f"trials run {report.get('tuning', {}).get('trials_run', 0)}, modelled "
                f"{report.get('modelled_ms', float('nan')):.3f} ms, peak "
                f"{answer['peak_rss_mb']:.0f} MB")
    result["compile"] = compiles
    result["korch_plan"] = compiles["korch"][phases[-1][0]].get("plan")
    result["kind_modelled_ms"] = {path: compiles[path][phases[-1][0]].get("kind_ms")
                                  for path in PATHS}
    return libraries, reports


def _memory_into(result: dict, runtimes: Runtimes, libraries: Mapping, log) -> None:
    """Each runtime's inference peak memory, each in its own child process."""
    result["inference_memory_mb"] = {}
    for name in PATHS + runtimes.foreign():
        answer = run_child({"kind": "memory", "runtime": name,
                            "model": os.path.abspath(runtimes.model),
                            "library": libraries.get(name), "threads": runtimes.threads,
                            "input_shapes": runtimes.input_shapes})
        result["inference_memory_mb"][name] = answer["inference_peak_mb"]
    log(f"inference peak memory (MB above baseline): {result['inference_memory_mb']}")


def _calibrate(result: dict, rows: Mapping, config, tuning_logs: str, model: str, log,
               cache_state: str) -> None:
    """Keep the in-model/isolated ratios in the log the compiles used (`cache_state`'s)."""
    from ..backend.target import target_tag
    from ..costing.cache_state import tag_suffix
    from ..costing.in_model import record_in_model_times

    directory = os.path.join(tuning_logs, target_tag(config.target) + tag_suffix(cache_state))
    stem = os.path.splitext(os.path.basename(model))[0]
    kept = record_in_model_times(directory, rows["stock"] + rows["korch"], stem)
    result["in_model"]["recorded"] = kept
    log(f"kept the in-model/isolated ratio of {kept} kernels in {directory} (later plans "
        "use them; delete the file to go back to isolated costs)")


def _time_into(result: dict, runtimes: Runtimes, libraries: Mapping,
               timing: TimingProtocol) -> None:
    """Time the libraries, ORT and OpenVINO interleaved; put samples, statistics, ratios, the
    foreign runtimes' settings and OpenVINO's verification against ORT into `result`."""
    inputs = engines.model_inputs(runtimes.model, runtimes.input_shapes)
    runners = engines.engine_runners(runtimes.model, libraries, inputs, runtimes.threads,
                                     with_ort=runtimes.with_ort,
                                     with_openvino=runtimes.with_openvino)
    samples = time_interleaved(runners, timing)
    del runners  # the sessions' threads and memory go before the profile opens new ones
    result["samples_ms"] = {name: [round(s * 1e3, 6) for s in values]
                            for name, values in samples.items()}
    result["latency_ms"] = {name: summarize_samples(values)
                            for name, values in result["samples_ms"].items()}
    result["ratios"] = _ratios(result["samples_ms"])
    _foreign_settings_into(result, runtimes, inputs)
    phases = result["compile"]["korch"]
    modelled = phases.get("warm", phases.get("cold", {})).get("modelled_ms")
    if modelled:
        result["korch_modelled_over_measured"] = modelled / result["latency_ms"]["korch"]["median"]


def _ratios(samples_ms: Mapping) -> dict:
    """Paired speed-ups: Korch over stock, and Korch and stock over each foreign runtime."""
    ratios = {"korch_vs_stock": paired_ratio(samples_ms["stock"], samples_ms["korch"])}
    for path in ("korch", "stock"):
        for foreign in ("onnxruntime", "openvino"):
            if foreign in samples_ms:
                ratios[f"{path}_vs_{foreign}"] = paired_ratio(samples_ms[foreign],
                                                              samples_ms[path])
    return ratios


def _foreign_settings_into(result: dict, runtimes: Runtimes, inputs: Mapping) -> None:
    if runtimes.with_ort:
        result["onnxruntime"] = {"version": engines.ort_version(),
                                 "settings": engines.ort_settings(runtimes.threads)}
    if runtimes.with_openvino:
        result["openvino"] = {"version": engines.openvino_version(),
                              "settings": engines.openvino_settings(runtimes.threads)}
        if runtimes.with_ort:
            result["openvino"]["verification"] = engines.openvino_verification(
                runtimes.model, inputs, runtimes.threads)


def _profile_into(result: dict, runtimes: Runtimes, libraries: Mapping,
                  reports: Mapping) -> dict:
    """Time every kernel call in the running libraries (and ORT's nodes); put the time per kind
    and the isolated -> in-model join into result; return the joined rows per path."""
    from ..costing.in_model import fidelity_by_kind, kernel_rows
    from .kind_profile import orchestration_ceiling, sum_by_kind

    kernel_ms, ort_kinds = profile_in_model(runtimes, libraries)
    result["kind_profile_ms"] = {
        path: sum_by_kind(kernel_ms[path], reports[path].get("kernel_kinds") or {})
        for path in PATHS}
    if ort_kinds is not None:
        result["kind_profile_ms"]["onnxruntime"] = ort_kinds
    result["orchestration_ceiling"] = orchestration_ceiling(result["kind_profile_ms"]["stock"])
    rows = {path: kernel_rows(reports[path], kernel_ms[path]) for path in PATHS}
    result["in_model"] = {"by_kind": {path: fidelity_by_kind(rows[path]) for path in rows},
                          "kernels": rows}
    return rows


def profile_in_model(runtimes: Runtimes, libraries: Mapping[str, str], runs: int = 10):
    """({library name: {kernel: in-model ms per run}}, ORT's ms per kind or None), after the
    timing: a separate pass, since timing every call slows the run a little, so the latency
    numbers come from the plain interleaved runs and this only says where the time goes."""
    from .kind_profile import ort_profiled_kind_times, tvm_kernel_times

    inputs = engines.model_inputs(runtimes.model, runtimes.input_shapes)
    args = engines.tvm_arguments(inputs)
    machines = engines.tvm_machines(libraries)
    kernel_ms = {name: tvm_kernel_times(vm, args, runs=runs) for name, vm in machines.items()}
    ort_kinds = None
    if runtimes.with_ort:
        ort_kinds = ort_profiled_kind_times(
            lambda options: engines.ort_session(runtimes.model, runtimes.threads, options),
            inputs, runs=runs)
    return kernel_ms, ort_kinds


def _add_floor(result: dict, machine) -> None:
    if machine:
        result["floor"] = floor_report(
            result["work"], machine,
            {name: stats["median"] for name, stats in result["latency_ms"].items()})


def retime(model, previous: dict, reports_dir: str, *, input_shapes=None, threads=None,
           timing: TimingProtocol = TimingProtocol(), with_ort: bool = True,
           with_openvino: bool = True, machine=None, log=None) -> dict:
    """Time again the libraries an earlier `bench_model` result `previous` kept in
    `reports_dir` (no compiles); the earlier timings are kept under "earlier_timings". The other
    arguments are as for `bench_model`; `threads` None: every core."""
    from ..backend.target import configure_threads
    from ..errors import KorchError

    runtimes = Runtimes(model, input_shapes or None, configure_threads(threads), with_ort,
                        with_openvino).available(log)
    stem = os.path.splitext(os.path.basename(model))[0]
    phase = previous.get("protocol", {}).get("timed_libraries", "warm")
    libraries = {path: os.path.join(reports_dir, f"{stem}.{path}.{phase}.so") for path in PATHS}
    for library in libraries.values():
        if not os.path.exists(library):
            raise KorchError(f"library '{library}' is missing; run bench with --reports-dir")
    result = dict(previous)
    result.pop("first_timing", None)
    result["earlier_timings"] = list(previous.get("earlier_timings", [])) + [
        {key: previous.get(key) for key in
         ("date", "samples_ms", "latency_ms", "ratios", "protocol")}]
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    result["protocol"] = {**previous.get("protocol", {}), **timing.as_dict(), "retimed": True}
    _time_into(result, runtimes, libraries, timing)
    reports = {path: os.path.join(reports_dir, f"{stem}.{path}.{phase}.json") for path in PATHS}
    if all(os.path.exists(path) for path in reports.values()):  # the profile needs them
        _profile_into(result, runtimes, libraries, {p: load_json(r) for p, r in reports.items()})
    _add_floor(result, machine)
    return result
