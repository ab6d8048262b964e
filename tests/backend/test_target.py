import os

import pytest
from korch_tvm.backend.target import host_core_count, host_cpu_name, parse_target, target_tag
from korch_tvm.errors import KorchError


@pytest.fixture(autouse=True)
def no_cpu_tag_override(monkeypatch):
    """These tests read real tags; CI runs the suite as an unshipped CPU (KORCH_TVM_CPU_TAG)."""
    monkeypatch.delenv("KORCH_TVM_CPU_TAG", raising=False)


def test_llvm_means_this_cpu():
    target = parse_target("llvm")
    assert target.kind.name == "llvm"
    assert str(target.attrs["mcpu"]) == host_cpu_name()
    assert int(target.attrs["num-cores"]) == host_core_count()
    assert target_tag(target) == f"llvm-{host_cpu_name()}-{host_core_count()}c"


def test_explicit_fields_win_and_json_text_is_accepted():
    target = parse_target('{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 3}')
    assert target_tag(target) == "llvm-skylake-avx512-3c"
    assert target_tag(parse_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 8})) == \
        "llvm-znver4-8c"


def test_cuda_target_has_an_arch_and_a_host():
    target = parse_target("cuda")
    assert target.kind.name == "cuda"
    assert target_tag(target) == "cuda-sm_90"
    assert target.host.kind.name == "llvm"
    assert target_tag(parse_target({"kind": "cuda", "arch": "sm_80"})) == "cuda-sm_80"


@pytest.mark.parametrize("bad", ["llvm -mcpu=znver4", "{not json", {"mcpu": "x"}, "nosuchkind"])
def test_bad_targets_are_one_line_errors(bad):
    with pytest.raises(KorchError) as info:
        parse_target(bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("spec, why", [
    ({"kind": "llvm", "mcpu": "../../../x"}, "is not a CPU name"),
    ({"kind": "llvm", "mcpu": "nosuchcpu"}, "is not a CPU LLVM knows"),
    ({"kind": "cuda", "arch": "sm_90/../.."}, "is not of the form sm_<digits>"),
    ({"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm", "mcpu": "a/b"}}, "not a CPU name"),
])
def test_cpu_and_gpu_names_that_cannot_be_a_directory_are_refused_up_front(spec, why, capfd):
    with pytest.raises(KorchError) as info:
        parse_target(spec)
    assert why in str(info.value) and "\n" not in str(info.value)
    assert "not a recognized processor" not in capfd.readouterr().err  # LLVM never asked


def test_the_cpu_tag_override_names_the_host_log_only(monkeypatch):
    from korch_tvm.backend.target import host_cpu_name

    target = parse_target({"kind": "llvm", "num-cores": 2})  # this machine's CPU, detected
    named = parse_target({"kind": "llvm", "mcpu": "haswell" if host_cpu_name() != "haswell"
                          else "znver4", "num-cores": 2})
    monkeypatch.setenv("KORCH_TVM_CPU_TAG", "ci-unshipped")
    assert target_tag(target) == "llvm-ci-unshipped-2c"
    assert str(target.attrs["mcpu"]) == host_cpu_name()  # code is still generated for it
    assert target_tag(named) == f"llvm-{named.attrs['mcpu']}-2c"  # a CPU named on purpose
    assert target_tag(parse_target("cuda")) == "cuda-sm_90"  # GPU tags are untouched
    for bad in ("../up", "a/b", "x..y", "sp ace"):
        monkeypatch.setenv("KORCH_TVM_CPU_TAG", bad)
        with pytest.raises(KorchError, match="KORCH_TVM_CPU_TAG .* cannot name a tuning-log"):
            target_tag(target)


def test_a_log_directory_must_resolve_inside_its_root(tmp_path):
    from korch_tvm.backend.target import inside_root
    from korch_tvm.costing.tuning_log import TuningLog

    target = parse_target({"kind": "llvm", "mcpu": "generic", "num-cores": 2})
    root = tmp_path / "logs"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / target_tag(target))
    with pytest.raises(KorchError, match="outside"):
        TuningLog(root, target)
    assert os.listdir(tmp_path / "elsewhere") == []
    assert inside_root(str(root), "llvm-x-2c") == os.path.join(str(root), "llvm-x-2c")
    with pytest.raises(KorchError, match="outside"):
        inside_root(str(root), "../x")
