import pytest
from korch_tvm.errors import KorchError
from korch_tvm.target import host_core_count, host_cpu_name, parse_target, target_tag


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
