"""Capture a reference's forward as a small graph of named ops with shapes and dtypes.

    graph = capture_source(problem_source)      # runs the capture in its own confined process
    graph.nodes  # [CNode(name="relu", op="relu", args=[{"ref": "add"}], shape=[64, 256], dtype="float32"), ...]

The reference is user code, so it never runs in the search's own process (which holds the harness's secret): the
capture runs `python -m runner.catalog.capture FILE` under runner.harness.sandbox, with the problem's inputs drawn under a
FakeTensorMode (no memory for KernelBench's large shapes; real CPU tensors when fake ones fail). torch.fx's
symbolic_trace comes first; torch.export is the fall-back; when both fail the graph is `unsupported` with the reason.

Ops are named by the function, method or module they came from (`relu`, `softmax`, `add`, `linear`...); arguments are
constants or `{"ref": node}`; a module's weights become `param` nodes numbered in state_dict order, after the forward's
inputs: exactly the order of the fast-format C ABI.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class CNode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    op: str  # "input", "param", "output", or the canonical op name
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    shape: list[int] | None = None
    dtype: str | None = None
    index: int | None = None  # input: position among forward args; param: position in state_dict
    where: str | None = None  # the problem's source line that made it ("problem.py:12: x = x.softmax(-1)")


class CGraph(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[CNode] = Field(default_factory=list)
    n_inputs: int = 0
    params: list[str] = Field(default_factory=list)  # state_dict keys, in order
    constants: list[str] = Field(default_factory=list)  # tensors no ABI input carries (non-persistent buffers...)
    param_shapes: list[list[int]] = Field(default_factory=list)
    tracer: str = ""  # "export"
    unsupported: str | None = None  # why no graph could be captured

    def node(self, name: str) -> CNode:
        return next(n for n in self.nodes if n.name == name)


# Ops that stay whole: the heavy ops run on torch (cuBLAS/cuDNN), and diag stays a diag so that diag(a) @ B can be
# recognised as a broadcast multiply. Everything else is decomposed to core ATen by torch's own tables.
_KEEP = ("linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
         "conv_transpose2d", "conv_transpose3d", "einsum", "diag", "scaled_dot_product_attention", "instance_norm")
TRIL = "tril"  # a buffer's checked structure: ones on and below the diagonal of its last two dims, zeros above
ARANGE = "arange"  # 0, 1, 2, ... along its last dim, every leading dim of size 1 (BERT's position_ids)


def op_name(target) -> str:
    """An ATen overload as 'name.overload' ('add.Tensor', 'amax' for '.default'); other callables by name."""
    import operator

    if target is operator.getitem:
        return "getitem"
    text = str(target)
    if text.startswith("aten."):
        return text.removeprefix("aten.").removesuffix(".default")
    return getattr(target, "__name__", str(target))


def _encode(arg) -> Any:
    import torch
    import torch.fx as fx

    if isinstance(arg, fx.Node):
        return {"ref": arg.name}
    if isinstance(arg, tuple | list):
        return [_encode(a) for a in arg]
    if isinstance(arg, dict):
        return {k: _encode(v) for k, v in arg.items()}
    if isinstance(arg, bool | int | float | str) or arg is None:
        return arg
    if isinstance(arg, torch.dtype):
        return str(arg).removeprefix("torch.")
    if isinstance(arg, torch.memory_format | torch.layout | torch.device):
        return str(arg)
    return {"opaque": type(arg).__name__}


def _where(node, files: tuple[str, ...]) -> str | None:
    """The source line of the problem's own code that made a node: the last frame of its stack trace in one of
    `files` (the problem file), else the trace's first frame."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', trace)
    if not frames:
        return None
    own = [f for f in frames if Path(f[0]).name in files] or frames[:1]
    path, line, code = own[-1]
    return f"{Path(path).name}:{line}: {code.strip()}"


def structure(t) -> str | None:
    """What a buffer is, where the catalog can use it: TRIL for a lower-triangular mask of ones (a causal mask),
    ARANGE for positions 0, 1, 2, ..."""
    import torch

    if t.dim() >= 1 and t.shape[-1] > 1 and all(x == 1 for x in t.shape[:-1]) and not t.is_floating_point() \
            and bool((t.reshape(-1) == torch.arange(t.shape[-1], dtype=t.dtype)).all()):
        return ARANGE
    if t.dim() < 2 or t.shape[-1] != t.shape[-2] or t.shape[-1] < 2 or t.is_floating_point() and not torch.isfinite(t).all():
        return None
    ones = torch.ones(t.shape[-2:], dtype=torch.bool).tril()
    return TRIL if bool((t != 0).eq(ones).all()) else None


def export_graph(model, args: list, files: tuple[str, ...] = ()) -> CGraph:
    """The forward's core-ATen graph: torch.export (non-strict), decomposed by torch's core ATen table."""
    import torch

    ep = torch.export.export(model, tuple(args), strict=False)
    table = torch.export.default_decompositions()
    for name in _KEEP:
        for overload in ("default", "input", "Tensor"):
            target = getattr(getattr(torch.ops.aten, name), overload, None)
            if target is not None:
                table.pop(target, None)
    ep = ep.run_decompositions(table)
    state = model.state_dict()
    keys = list(state.keys())
    g = CGraph(n_inputs=sum(1 for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"), params=keys,
               param_shapes=[list(t.shape) for t in state.values()], tracer="export")
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    for n in ep.graph_module.graph.nodes:
        val = n.meta.get("val")
        shape = list(val.shape) if isinstance(val, torch.Tensor) else None
        dtype = str(val.dtype).removeprefix("torch.") if isinstance(val, torch.Tensor) else None
        if n.op == "placeholder":
            spec = specs.get(n.name)
            kind = spec.kind.name if spec is not None else "USER_INPUT"
            if kind == "USER_INPUT":
                g.nodes.append(CNode(name=n.name, op="input", index=users.index(n.name), shape=shape, dtype=dtype))
                continue
            target = str(spec.target)
            real = _attr(model, target)
            kw = {"target": target}
            if real is not None and (s := structure(real)) is not None:
                kw["structure"] = s
            if target in state:
                g.nodes.append(CNode(name=n.name, op="param", index=g.n_inputs + keys.index(target), shape=shape,
                                     dtype=dtype, kwargs=kw))
            elif real is not None and real.numel() == 1:
                g.nodes.append(CNode(name=n.name, op="const", args=[float(real.item())], shape=shape, dtype=dtype))
            else:  # a non-persistent buffer or a lifted constant: no input of the fast ABI carries it; a KernelBench
                # candidate passes it after the state_dict (index), read from the reference module by its name
                g.constants.append(target)
                g.nodes.append(CNode(name=n.name, op="constant_tensor", shape=shape, dtype=dtype, kwargs=kw,
                                     index=g.n_inputs + len(keys) + len(g.constants) - 1))
            continue
        if n.op == "output":
            g.nodes.append(CNode(name=n.name, op="output", args=[_encode(n.args[0])]))
            continue
        if n.op != "call_function":
            raise ValueError(f"graph node {n.op} {n.target}")
        name = op_name(n.target)
        if name in ("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size"):
            continue
        g.nodes.append(CNode(name=n.name, op=name, args=_encode(list(n.args)), kwargs=_encode(dict(n.kwargs)),
                             shape=shape, dtype=dtype, where=_where(n, files)))
    return g


def _attr(model, target: str):
    obj = model
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def capture_model(model, args: list, files: tuple[str, ...] = ()) -> CGraph:
    """torch.export + core ATen; `unsupported` says why when the graph cannot be captured."""
    try:
        return export_graph(model, args, files)
    except Exception as exc:  # noqa: BLE001 - user code may fail to export in any way
        return CGraph(unsupported=f"torch.export: {type(exc).__name__}: {str(exc)[:600]}")


def capture_file(path: Path) -> CGraph:
    """Import a KernelBench-format file and capture its Model (fake tensors first, then small real ones)."""
    import torch

    from runner.harness.problem import import_file

    mod = import_file(path, "fusebot_capture_" + path.stem)
    init = list(mod.get_init_inputs()) if hasattr(mod, "get_init_inputs") else []
    torch.manual_seed(0)
    model = mod.Model(*init).eval()
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True):
            args = list(mod.get_inputs())
            g = capture_model(model, args, (path.name,))
        if g.unsupported is None:
            return g
        first = g.unsupported
    except Exception as exc:  # noqa: BLE001
        first = f"{type(exc).__name__}: {exc}"
    log.info("capture with fake tensors failed (%s); trying real ones", first)
    args = list(mod.get_inputs())
    g = capture_model(model, args, (path.name,))
    if g.unsupported is not None:  # both reasons: the first is usually the one that matters
        g.unsupported = f"with fake tensors: {first[:600]}; with real ones: {g.unsupported}"
    return g


def capture_source(source: str, *, timeout_s: float = 120.0) -> CGraph:
    """Capture a problem given as source text, in a confined child process. Never raises for a bad problem."""
    return capture_sources([source], timeout_s=timeout_s)[0]


def capture_sources(sources: list[str], *, timeout_s: float = 300.0) -> list[CGraph]:
    """Capture several problems in one confined child process (torch is imported once)."""
    from runner.harness.sandbox import confined_env

    with tempfile.TemporaryDirectory(prefix="fusebot-capture-") as tmp:
        work = Path(tmp)
        files = []
        for k, src in enumerate(sources):
            (work / f"problem_{k}.py").write_text(src)
            files.append(str(work / f"problem_{k}.py"))
        env = confined_env(work)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
        # torch.export may write compile caches: inside the confined work folder, never a shared one
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache")
        env["XDG_CACHE_HOME"] = str(work / "cache")
        cmd = [sys.executable, "-m", "runner.harness.sandbox", "--write", str(work), "--",
               sys.executable, "-m", "runner.catalog.capture", *files]
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return [CGraph(unsupported=f"capture timed out after {timeout_s:.0f} s") for _ in sources]
        out = []
        for f in files:
            res = Path(f).with_suffix(".json")
            if not res.exists():
                out.append(CGraph(unsupported=f"capture failed: {(proc.stdout + proc.stderr).strip()[-800:]}"))
            else:
                out.append(CGraph.model_validate_json(res.read_text()))
        return out


def main(argv: list[str]) -> int:
    """`python -m runner.catalog.capture FILE...`: writes FILE's graph beside it, as FILE with the suffix .json."""
    logging.basicConfig(level=logging.WARNING)
    for arg in argv:
        src = Path(arg)
        try:
            g = capture_file(src)
        except BaseException as exc:  # noqa: BLE001 - the problem itself is broken: say so in the graph
            g = CGraph(unsupported=f"the problem does not load: {type(exc).__name__}: {exc}")
        src.with_suffix(".json").write_text(json.dumps(g.model_dump()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
