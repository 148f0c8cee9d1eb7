"""The drop-in's parts (runner/shipped/dropin/), imported as modules and called directly: the guard's dtype, rank and
shape checks, the choice of a shipped library or device code by arch, the cache's integrity check, FUSEBOT_DISABLE;
and what the generator keeps of each part (runner/harness/dropin.py)."""

from __future__ import annotations

import ast
import base64
import hashlib
import os
import types
import zlib
from pathlib import Path

import pytest
import torch

from runner.contract import ProblemSpec
from runner.harness import dropin as generator
from runner.harness.refs import resolve_source
from runner.shipped.dropin import adopt, call, device, guard, head, runtime

ROOT = Path(__file__).resolve().parents[3]
SPEC = ProblemSpec(name="scale_relu", path=str(ROOT / "tests/fixtures/problems/scale_relu.py"))
F32 = torch.float32
VERIFIED = ([("tensor", F32, (4, 8)), ("number", "float")], [(F32, (8,))])  # (args, state), as _verified() gives


def _items(x_shape=(4, 8), x_dtype=F32, scale=2.0, w_shape=(8,)):
    return [torch.zeros(x_shape, dtype=x_dtype), scale, torch.zeros(w_shape)]


def test_the_guard_takes_the_verified_call_and_says_what_differs_in_any_other():
    assert guard._outside(VERIFIED, _items(), None) is None
    assert guard._outside(VERIFIED, _items(x_dtype=torch.float64), None) == (
        "dtype", "input 0 (an argument) is torch.float64 (verified: torch.float32)")
    assert guard._outside(VERIFIED, _items(x_shape=(4, 8, 1)), None) == (
        "rank", "input 0 (an argument) has 3 dims (verified: 2)")
    assert guard._outside(VERIFIED, _items(scale=2), None) == (
        "args", "input 1 (an argument) is a int (verified: a Python float)")
    assert guard._outside(VERIFIED, _items()[:2], None)[0] == "args"
    category, text = guard._outside(VERIFIED, _items(w_shape=(9,)), None)
    assert category == "shape" and text.startswith("input 2 (a parameter or buffer) has shape (9,)")


def test_the_guard_takes_other_sizes_only_as_the_kernels_size_rules_say():
    rows_free = {0: ("d0", "d1"), 2: ("d1",)}  # x's rows any size, its columns the weight's
    assert guard._outside(VERIFIED, _items(x_shape=(5, 8)), rows_free) is None
    assert guard._outside(VERIFIED, _items(x_shape=(5, 9), w_shape=(9,)), rows_free) is None
    category, text = guard._outside(VERIFIED, _items(x_shape=(5, 9)), rows_free)
    assert category == "shape" and "where another input has 9" in text
    assert guard._outside(VERIFIED, _items(x_shape=(0, 8)), rows_free)[0] == "empty"
    assert guard._outside(VERIFIED, _items(x_shape=(5, 8)), None)[0] == "shape"  # no rules: the verified shapes only
    assert guard._outside(VERIFIED, _items(x_shape=(2, 16)), {0: 32}) is None  # an element count: any shape of 32
    assert guard._outside(VERIFIED, _items(x_shape=(4, 9)), {0: 32}) == (
        "shape", "input 0 (an argument) has 36 elements (the kernel is built for 32)")


def test_a_size_rule_reads_fixed_shared_and_merged_dims():
    assert guard._size_miss((2, 16), 32, {}) is None
    assert guard._size_miss((4, 8), 32, {}) is None
    assert guard._size_miss((4, 9), 32, {}) == "has 36 elements (the kernel is built for 32)"
    assert guard._size_miss((4, 8), (4, "d0"), {}) is None
    assert guard._size_miss((3, 8), (4, "d0"), {}) == "has size 3 along dim 0 (the kernel is built for 4)"
    assert guard._size_miss((4, 8), ("d0",), {}) == "has 2 dims (the kernel reads 1)"
    seen = {}
    assert guard._size_miss((4, 6), ("d0", "d1"), seen) is None and seen == {"d0": 4, "d1": 6}
    assert guard._size_miss((2, 3), ("m1", "m1"), seen) is None  # 2 * 3 is d1
    assert "merged dims" in guard._size_miss((2, 4), ("m1", "m1"), seen)


def test_the_kernel_path_copies_only_an_output_layout_it_can_fill():
    assert call._dense((4, 8), (8, 1)) and call._dense((4, 8), (1, 4))  # row-major, a transpose
    assert not call._dense((4, 8), (16, 1))  # a slice of something wider


def test_the_abi_arrays_a_call_fills_from_its_signatures_template():
    tensors = [torch.zeros(4, 8), torch.zeros(8, 4).t(), torch.zeros((), dtype=torch.int64)]
    arr = call._describe_all(tensors)
    for got, t in zip(arr, tensors, strict=True):
        assert got.data == t.data_ptr() and got.dtype == guard._DTYPES[t.dtype] and got.ndim == t.dim()
        assert list(got.shape)[:t.dim()] == list(t.shape) and list(got.strides)[:t.dim()] == list(t.stride())
    template = call._template([(t.dtype, tuple(t.shape), tuple(t.stride())) for t in tensors])
    others = [torch.ones(4, 8), torch.ones(8, 4).t(), torch.ones((), dtype=torch.int64)]
    first, second = call._filled(template, others), call._filled(template, tensors)
    assert [a.data for a in first] == [t.data_ptr() for t in others]  # each call its own array
    assert bytes(second) == bytes(arr)
    assert call._describe_all([])[0].ndim == 0  # never an empty array


@pytest.mark.parametrize("shape", [(4, 8), (3, 1), (1, 5), (2, 0, 3), (), (7,)])
def test_the_outputs_strides_are_torch_emptys(shape):
    assert call._contiguous(shape) == torch.empty(shape).stride()


def test_a_library_runs_on_its_own_arch_and_later_ones_of_the_same_kind():
    assert runtime._fits("sm_80", "sm_90") and not runtime._fits("sm_90", "sm_80")
    assert runtime._fits("x86-64-v2", "x86-64-v3") and not runtime._fits("x86-64-v4", "x86-64-v3")
    assert runtime._fits("aarch64", "aarch64") and not runtime._fits("aarch64", "x86-64-v3")
    assert not runtime._fits("sm_80", "x86-64-v4")


@pytest.mark.parametrize(("flags", "level"), [(set(), "x86-64"),
                                              ({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}, "x86-64-v2"),
                                              ({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}, "x86-64")])
def test_the_cpu_level_is_the_highest_whose_lower_levels_the_cpu_has_too(monkeypatch, flags, level):
    monkeypatch.setattr(runtime, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(runtime.os, "uname", lambda: types.SimpleNamespace(machine="x86_64"))
    assert runtime._host_arch() == level


def _ship(folder: Path, arch: str, data: bytes) -> tuple[str, str]:
    name = f"kernel.{arch}.so.b64"
    (folder / name).write_text("# a comment line\n" + base64.b64encode(zlib.compress(data)).decode() + "\n")
    return name, hashlib.sha256(data).hexdigest()


def test_the_shipped_library_of_the_highest_fitting_level_is_loaded_when_its_sha256_holds(tmp_path, monkeypatch):
    shipped = {arch: _ship(tmp_path, arch, arch.encode()) for arch in ("x86-64-v2", "x86-64-v3", "x86-64-v4")}
    monkeypatch.setattr(runtime, "_HERE", tmp_path)
    monkeypatch.setattr(runtime, "SHIPPED", shipped)
    assert runtime._shipped("x86-64-v3") == b"x86-64-v3"
    assert runtime._shipped("x86-64-v2") == b"x86-64-v2"
    assert runtime._shipped("x86-64") is None and runtime._shipped("aarch64") is None
    (tmp_path / shipped["x86-64-v3"][0]).write_text(base64.b64encode(zlib.compress(b"changed")).decode())
    with pytest.warns(guard.FallbackWarning, match="does not have the sha256 recorded"):
        assert runtime._shipped("x86-64-v3") is None


def _cached(folder: Path, data: bytes) -> Path:
    folder.mkdir(mode=0o700)
    lib = folder / "kernel.so"
    lib.write_bytes(data)
    (folder / "kernel.so.sha256").write_text(hashlib.sha256(data).hexdigest())
    for p in (lib, folder / "kernel.so.sha256"):
        p.chmod(0o600)
    return lib


def test_a_cached_library_is_intact_only_when_private_and_unchanged(tmp_path):
    lib = _cached(tmp_path / "a", b"library")
    assert runtime._intact(lib)
    lib.write_bytes(b"planted")
    assert not runtime._intact(lib)
    lib = _cached(tmp_path / "b", b"library")
    lib.parent.chmod(0o770)
    assert not runtime._intact(lib)  # a folder others may write to
    lib.parent.chmod(0o700)
    lib.chmod(0o666)
    assert not runtime._intact(lib)
    lib.chmod(0o600)
    link = _cached(tmp_path / "c", b"library")
    link.unlink()
    link.symlink_to(lib)
    assert not runtime._intact(link)
    assert not runtime._intact(tmp_path / "missing" / "kernel.so")


def test_the_device_code_is_the_gpus_own_cubin_else_the_latest_ptx_it_can_compile(tmp_path, monkeypatch):
    cubin, ptx = b"\x7fELF cubin", ".version 8.0\n.target sm_80\n"
    (tmp_path / "kernel.sm_90.cubin.b64").write_text("# sm_90\n" + base64.b64encode(cubin).decode() + "\n")
    (tmp_path / "kernel.compute_80.ptx").write_text("// SPDX-License-Identifier: MIT\n" + ptx)
    code = {"sm_90": ("kernel.sm_90.cubin.b64", hashlib.sha256(cubin).hexdigest()),
            "compute_80": ("kernel.compute_80.ptx", hashlib.sha256(ptx.encode()).hexdigest())}
    monkeypatch.setattr(device, "_HERE", tmp_path)
    monkeypatch.setattr(device, "DEVICE_CODE", code)
    for host, want in (("sm_90", (cubin, "sm_90")), ("sm_100", (ptx.encode() + b"\0", "compute_80")),
                       ("sm_86", (ptx.encode() + b"\0", "compute_80"))):
        monkeypatch.setattr(device, "_host_arch", lambda _device, host=host: host)
        assert device._device_image(None) == want
    monkeypatch.setattr(device, "_host_arch", lambda _device: "sm_75")
    with pytest.raises(runtime.BuildError, match="does not run on this GPU"):
        device._device_image(None)
    monkeypatch.setattr(device, "_host_arch", lambda _device: "sm_90")
    (tmp_path / "kernel.sm_90.cubin.b64").write_text(base64.b64encode(b"other").decode())
    with pytest.raises(runtime.BuildError, match="does not have the sha256"):
        device._device_image(None)


@pytest.mark.parametrize(("value", "off"), [("", False), ("0", False), ("1", True), ("all", True),
                                            ("Other, RowGain", True), ("target", True), ("Other", False)])
def test_fusebot_disable_names_every_dropin_or_some(monkeypatch, value, off):
    monkeypatch.setenv("FUSEBOT_DISABLE", value)
    assert adopt._env_off("RowGain") is off  # the stand-in head's target is "target"


def _top_level_names(text: str) -> set[str]:
    """The names a module binds outside its functions and classes (in its if, try and for blocks too)."""
    names, nodes = set(), list(ast.parse(text).body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If | ast.Try | ast.For | ast.With):
            nodes += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            nodes += [s for h in getattr(node, "handlers", []) for s in h.body]
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_every_name_a_part_takes_from_another_is_defined_in_the_generated_dropin(backend):
    text = generator.dropin_source(SPEC, backend)
    defined = _top_level_names(text)
    for name in generator.PARTS:
        source = (ROOT / "runner/shipped/dropin" / f"{name}.py").read_text()
        header = source.split(generator.BODY, 1)[0]
        tree = ast.parse(header)
        taken = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        taken |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}  # forwarders to a later part
        assert taken - {"ABI_DTYPES"} <= defined, (name, sorted(taken - defined))
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
    assert "runner" not in imported and "fusebot" not in imported


def test_the_generator_keeps_each_part_below_its_line_and_writes_the_resolver_and_dtype_table():
    text = generator.dropin_source(SPEC, "cpu")
    for name in generator.PARTS:
        source = (ROOT / "runner/shipped/dropin" / f"{name}.py").read_text()
        kept = generator.part(name)
        assert generator.BODY not in kept and '"""' + source.split('"""')[1] not in kept  # its docstring is not
        assert "runner.shipped" not in kept
    guard_text = generator.part("guard")
    assert guard_text.count(resolve_source("_resolve")) == 1 and "fusebot: inline" not in guard_text
    table = next(line for line in guard_text.splitlines() if line.startswith("_DTYPES = "))
    assert "torch.float32: 0" in table and "fusebot: abi dtypes" not in guard_text
    assert generator.part("forward") in text and generator.part("runtime") in text
    assert "class Model(Original):" in text and "__NAME__" not in text and "__TARGET__" not in text


def test_the_stand_in_head_names_what_the_generated_head_defines():
    generated = _top_level_names(generator.dropin_source(SPEC, "cpu"))
    stand_ins = {n for n in vars(head) if not n.startswith("__") and n not in ("Path", "ModuleType", "torch")}
    assert stand_ins <= generated, sorted(stand_ins - generated)
    assert os.path.samefile(head._HERE, ROOT / "runner/shipped/dropin")
