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
import operator
import os
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


class CGraph(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[CNode] = Field(default_factory=list)
    n_inputs: int = 0
    params: list[str] = Field(default_factory=list)  # state_dict keys, in order
    param_shapes: list[list[int]] = Field(default_factory=list)
    tracer: str = ""  # "fx" or "export"
    unsupported: str | None = None  # why no graph could be captured

    def node(self, name: str) -> CNode:
        return next(n for n in self.nodes if n.name == name)


_OPERATORS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
              operator.neg: "neg", operator.pow: "pow", operator.getitem: "getitem", operator.matmul: "matmul",
              operator.iadd: "add", operator.imul: "mul", operator.isub: "sub", operator.itruediv: "div"}

_RENAMES = {"truediv": "div", "true_divide": "div", "divide": "div", "multiply": "mul", "subtract": "sub",
            "clip": "clamp", "negative": "neg", "absolute": "abs", "mm": "matmul", "bmm": "matmul"}


def _canon(name: str) -> str:
    name = name.rstrip("_") if name not in ("__and__",) else name
    return _RENAMES.get(name, name)


def _module_op(mod) -> tuple[str, dict]:
    """A leaf module as (op, hyper-parameters)."""
    import torch.nn as nn

    kind = type(mod).__name__
    hp: dict[str, Any] = {}
    if isinstance(mod, nn.Linear):
        return "linear", hp
    if isinstance(mod, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.ConvTranspose2d | nn.ConvTranspose3d):
        hp = {"stride": list(mod.stride), "padding": list(mod.padding) if not isinstance(mod.padding, str)
              else mod.padding, "dilation": list(mod.dilation), "groups": mod.groups}
        return kind.lower(), hp
    if isinstance(mod, nn.LayerNorm):
        return "layer_norm", {"normalized_shape": list(mod.normalized_shape), "eps": mod.eps,
                              "affine": mod.weight is not None}
    if isinstance(mod, nn.GroupNorm):
        return "group_norm", {"num_groups": mod.num_groups, "eps": mod.eps, "affine": mod.affine}
    if isinstance(mod, nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d):
        stats = mod.track_running_stats and not mod.training
        return "batch_norm", {"eps": mod.eps, "affine": mod.affine, "running": stats}
    if isinstance(mod, nn.InstanceNorm1d | nn.InstanceNorm2d | nn.InstanceNorm3d):
        stats = mod.track_running_stats and not mod.training  # in training mode the input's own statistics
        return "instance_norm", {"eps": mod.eps, "affine": mod.affine, "running": stats}
    if isinstance(mod, nn.Softmax | nn.LogSoftmax):
        return ("softmax" if isinstance(mod, nn.Softmax) else "log_softmax"), {"dim": mod.dim}
    if isinstance(mod, nn.GELU):
        return "gelu", {"approximate": mod.approximate}
    if isinstance(mod, nn.LeakyReLU):
        return "leaky_relu", {"negative_slope": mod.negative_slope}
    if isinstance(mod, nn.Hardtanh):  # ReLU6 too
        return "hardtanh", {"min_val": mod.min_val, "max_val": mod.max_val}
    if isinstance(mod, nn.ELU):
        return "elu", {"alpha": mod.alpha}
    if isinstance(mod, nn.Softplus):
        return "softplus", {"beta": mod.beta, "threshold": mod.threshold}
    if isinstance(mod, nn.Dropout | nn.Identity | nn.Dropout2d):
        return "identity", {}
    if isinstance(mod, nn.MSELoss | nn.L1Loss | nn.SmoothL1Loss | nn.HuberLoss | nn.KLDivLoss):
        hp = {"reduction": mod.reduction}
        if isinstance(mod, nn.SmoothL1Loss):
            hp["beta"] = mod.beta
        if isinstance(mod, nn.HuberLoss):
            hp["delta"] = mod.delta
        return {"MSELoss": "mse_loss", "L1Loss": "l1_loss", "SmoothL1Loss": "smooth_l1_loss",
                "HuberLoss": "huber_loss", "KLDivLoss": "kl_div"}[kind], hp
    simple = {"SELU": "selu", "ReLU": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "SiLU": "silu", "Hardsigmoid": "hardsigmoid",
              "Hardswish": "hardswish", "Mish": "mish", "Softsign": "softsign"}
    if kind in simple:
        return simple[kind], hp
    return "module:" + kind, hp


def _describe(value) -> tuple[list[int] | None, str | None, Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return list(value.shape), str(value.dtype).removeprefix("torch."), None
    if isinstance(value, torch.Size):
        return None, None, [int(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return None, None, value
    if isinstance(value, tuple | list) and all(isinstance(v, bool | int | float) for v in value):
        return None, None, list(value)
    if isinstance(value, tuple | list) and value and isinstance(value[0], torch.Tensor):
        return None, "tuple", None
    return None, None, None


def _encode(arg, values: dict[str, Any]) -> Any:
    import torch.fx as fx

    if isinstance(arg, fx.Node):
        if arg.name in values:  # a traced int (x.size(1), ...) becomes the constant it was
            return values[arg.name]
        return {"ref": arg.name}
    if isinstance(arg, tuple | list):
        return [_encode(a, values) for a in arg]
    if isinstance(arg, dict):
        return {k: _encode(v, values) for k, v in arg.items()}
    if isinstance(arg, bool | int | float | str) or arg is None:
        return arg
    import torch

    if isinstance(arg, torch.dtype):
        return str(arg).removeprefix("torch.")
    if isinstance(arg, torch.memory_format | torch.layout | torch.device):
        return str(arg)
    return {"opaque": type(arg).__name__}


def _value(gm, target: str) -> float:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj.item()


def _record(gm, args: list) -> dict[str, Any]:
    """Run the graph once and record each node's result (tensors: shape/dtype; numbers: the value)."""
    import torch.fx as fx

    seen: dict[str, Any] = {}

    class Rec(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            seen[n.name] = out
            return out

    Rec(gm).run(*args)
    return seen


def graph_from_fx(gm, model, args: list, tracer: str = "fx") -> CGraph:
    """The captured graph of an fx GraphModule (from symbolic_trace) run on `args` (fake or real tensors)."""
    import torch

    results = _record(gm, args)
    state = list(model.state_dict().keys()) if hasattr(model, "state_dict") else []
    g = CGraph(n_inputs=len(args), params=state, tracer=tracer,
               param_shapes=[list(t.shape) for t in model.state_dict().values()] if state else [])
    consts: dict[str, Any] = {}
    names: set[str] = set()
    placeholder = 0
    modules = dict(gm.named_modules())

    def param_node(key: str) -> dict:
        if key not in state:
            raise ValueError(f"attribute {key} is not in the state_dict (a constant tensor?)")
        name = "p_" + key.replace(".", "_")
        if name not in names:
            names.add(name)
            idx = state.index(key)
            g.nodes.append(CNode(name=name, op="param", index=g.n_inputs + idx, shape=g.param_shapes[idx],
                                 dtype=str(model.state_dict()[key].dtype).removeprefix("torch.")))
        return {"ref": name}

    for n in gm.graph.nodes:
        val = results.get(n.name)
        shape, dtype, const = _describe(val)
        if n.op == "placeholder":
            g.nodes.append(CNode(name=n.name, op="input", index=placeholder, shape=shape, dtype=dtype))
            placeholder += 1
            names.add(n.name)
            continue
        if n.op == "output":
            g.nodes.append(CNode(name=n.name, op="output", args=[_encode(n.args[0], consts)]))
            continue
        if shape is None and dtype is None and n.op != "get_attr":  # a number computed from shapes (x.size(1), x.shape[0] * 2)
            if const is not None or val is None:
                consts[n.name] = const
                continue
            if isinstance(val, torch.device | torch.dtype):  # x.device, x.dtype: arguments of torch.tensor(...)
                consts[n.name] = str(val)
                continue
        args = _encode(list(n.args), consts)
        kwargs = _encode(dict(n.kwargs), consts)
        if n.op == "get_attr":
            if str(n.target) not in state and isinstance(val, torch.Tensor) and val.numel() == 1:
                # a constant folded in by the tracer (torch.tensor(0.5) in forward): its value, not an input
                g.nodes.append(CNode(name=n.name, op="const", args=[float(_value(gm, str(n.target)))], shape=shape,
                                     dtype=dtype))
            else:
                ref = param_node(str(n.target))
                g.nodes.append(CNode(name=n.name, op="identity", args=[ref], shape=shape, dtype=dtype))
        elif n.op == "call_function":
            target = n.target
            op = _OPERATORS.get(target) or _canon(getattr(target, "__name__", str(target)))
            g.nodes.append(CNode(name=n.name, op=op, args=args, kwargs=kwargs, shape=shape, dtype=dtype))
        elif n.op == "call_method":
            g.nodes.append(CNode(name=n.name, op=_canon(str(n.target)), args=args, kwargs=kwargs, shape=shape,
                                 dtype=dtype))
        elif n.op == "call_module":
            mod = modules[str(n.target)]
            op, hp = _module_op(mod)
            names_ = [p for p, _ in mod.named_parameters(recurse=False)]
            if op in ("batch_norm", "instance_norm") and hp.get("running"):  # statistics: buffers, in the state_dict
                names_ = ["running_mean", "running_var", *names_]
            extra = [param_node(f"{n.target}.{p}") for p in names_]
            kw = {**hp, **kwargs, "params": names_, "module": n.target}
            g.nodes.append(CNode(name=n.name, op=op, args=args + extra, kwargs=kw, shape=shape, dtype=dtype))
        names.add(n.name)
    return g


def capture_model(model, args: list) -> CGraph:
    """symbolic_trace first, torch.export second; `unsupported` says why when neither works."""
    import torch
    import torch.fx as fx

    errors = []
    try:
        gm = fx.symbolic_trace(model)
        return graph_from_fx(gm, model, args, "fx")
    except Exception as exc:  # noqa: BLE001 - user code may fail to trace in any way
        errors.append(f"torch.fx: {type(exc).__name__}: {exc}")
    try:
        ep = torch.export.export(model, tuple(args))
        gm = ep.module()
        return graph_from_fx(gm, model, args, "export")
    except Exception as exc:  # noqa: BLE001
        errors.append(f"torch.export: {type(exc).__name__}: {exc}")
    return CGraph(unsupported="; ".join(e[:300] for e in errors))


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
            g = capture_model(model, args)
        if g.unsupported is None:
            return g
        log.info("capture with fake tensors failed (%s); trying real ones", g.unsupported)
    except Exception as exc:  # noqa: BLE001
        log.info("fake-tensor capture failed: %s", exc)
    args = list(mod.get_inputs())
    return capture_model(model, args)


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
