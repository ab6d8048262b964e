"""The physical floor of a model on a machine: FLOPs of its linear primitives, the bytes it must
move at least once, and the roofline bound they give; and the machine facts a result names.

It exists so a benchmark can say how far each runtime is from what the hardware allows, not only
how the runtimes compare with each other.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence


LINEAR_OPS = ("relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
              "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose",
              "relax.nn.conv3d_transpose")


def linear_flops(op_name: str, input_shapes: Sequence[Sequence[int]],
                 output_shape: Sequence[int]) -> int:
    """Floating-point operations (a multiply-add is 2) of one linear primitive.

    matmul: 2 * |out| * K with K the last dim of the first operand. conv: 2 * |out| * |weight| /
    out_channels (= C_in/groups * kernel window). conv_transpose: 2 * |in| * |weight| / C_in
    (each input element scatters into C_out/groups * window outputs).
    """
    out = _prod(output_shape)
    if op_name == "relax.matmul":
        return 2 * out * int(input_shapes[0][-1])
    weight = input_shapes[1]
    if op_name.endswith("_transpose"):
        return 2 * _prod(input_shapes[0]) * _prod(weight) // int(weight[0])
    if op_name.startswith("relax.nn.conv"):
        return 2 * out * _prod(weight) // int(weight[0])
    raise ValueError(f"{op_name} is not a linear primitive")


def _prod(shape: Sequence[int]) -> int:
    result = 1
    for dim in shape:
        result *= int(dim)
    return result


def _dtype_bytes(dtype: str) -> int:
    if dtype == "bool":
        return 1
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return max(1, int(digits or 32) // 8)


def floor_seconds(flops: float, min_bytes: float, peak_flops: float,
                  bandwidth: float) -> dict:
    """The roofline floor max(FLOPs / peak, bytes / bandwidth) and which term binds."""
    compute = flops / peak_flops
    memory = min_bytes / bandwidth
    return {"seconds": max(compute, memory), "compute_seconds": compute,
            "memory_seconds": memory, "bound": "compute" if compute >= memory else "memory"}


def model_work(relax_module) -> dict:
    """FLOPs and minimum bytes of the primitive graph of a Relax model (`main`).

    FLOPs count the linear primitives (matmul, conv) after Korch's fission, from their shapes;
    the other primitives are counted separately (one operation per output element) and left out
    of the floor. Minimum bytes = model inputs + outputs + every weight/constant read once:
    what any implementation must move between memory and the cores at least once.
    """
    import tvm
    from tvm import relax

    from ..lowering.fission import lower_to_primitives

    lowered = lower_to_primitives(relax_module)
    func = lowered["main"]
    num_input = (int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs
                 else len(func.params))
    flops = other_ops = 0
    linear_count = 0
    constants = {}
    by_op: dict[str, int] = {}

    def tensor_bytes(sinfo) -> int:
        if isinstance(sinfo, relax.TensorType):
            return _prod(_static_shape(sinfo)) * _dtype_bytes(str(sinfo.dtype))
        if isinstance(sinfo, relax.TupleType):
            return sum(tensor_bytes(field) for field in sinfo.fields)
        return 0

    def visit(expr):
        nonlocal flops, other_ops, linear_count
        if isinstance(expr, tvm.ir.expr.Constant):
            constants[expr] = tensor_bytes(expr.ty)
        if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
            return
        name = expr.op.name
        out_sinfo = expr.ty
        if name in LINEAR_OPS:
            shapes = [_static_shape(arg.ty) for arg in expr.args[:2]]
            work = linear_flops(name, shapes, _static_shape(out_sinfo))
            flops += work
            linear_count += 1
            by_op[name] = by_op.get(name, 0) + work
        elif isinstance(out_sinfo, relax.TensorType):
            other_ops += _prod(_static_shape(out_sinfo))

    relax.analysis.post_order_visit(func.body, visit)
    weights = sum(tensor_bytes(p.ty) for p in func.params[num_input:])
    inputs = sum(tensor_bytes(p.ty) for p in func.params[:num_input])
    outputs = tensor_bytes(func.body.body.ty)
    constant_bytes = sum(constants.values())
    return {"linear_flops": flops, "linear_primitives": linear_count,
            "flops_by_op": by_op, "other_elementwise_ops": other_ops,
            "input_bytes": inputs, "output_bytes": outputs,
            "weight_bytes": weights + constant_bytes,
            "min_bytes": inputs + outputs + weights + constant_bytes}


def _static_shape(sinfo) -> list[int]:
    from ..errors import KorchError

    try:
        return [int(dim) for dim in sinfo.shape.values]
    except (AttributeError, TypeError):
        raise KorchError("the floor needs static shapes") from None


def floor_report(work: Mapping, machine: Mapping, latencies: Mapping[str, float]) -> dict:
    """Floor of a model on a machine, and each runtime's latency / floor."""
    peak = machine.get("peak_flops") or machine["matmul_peak_flops"]
    floor = floor_seconds(work["linear_flops"], work["min_bytes"], peak,
                          machine["bandwidth_bytes_per_s"])
    floor_ms = floor["seconds"] * 1e3
    return {**floor, "ms": floor_ms, "peak_flops": peak,
            "bandwidth_bytes_per_s": machine["bandwidth_bytes_per_s"],
            "latency_over_floor": {name: (ms / floor_ms if ms and floor_ms > 0 else None)
                                   for name, ms in latencies.items()}}


# ----------------------------------------------------------------------------- machine facts
def machine_info() -> dict:
    """CPU model, cores, memory, OS: what a reader needs to weigh the numbers."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory_gb = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    from .engines import cores

    return {"cpu": cpu, "cores": cores(), "memory_gb": memory_gb,
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}
