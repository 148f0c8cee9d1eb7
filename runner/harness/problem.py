"""Problems: the reference module, its inputs and its tolerance, loaded inside a child process.

A `ProblemSpec` (runner.contract) names a KernelBench-format file or a module in a repository. This module turns it
into live objects: the reference class, the input factories and the init arguments. Anything that goes wrong in the
user's code becomes a `ProblemError` naming the file, the line and the cause.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runner.contract import DEFAULT_TOLERANCE, ProblemSpec
from runner.errors import ProblemError
from runner.harness.refs import resolve

__all__ = ["ProblemError", "LoadedProblem", "load", "make_inputs", "build_model", "bytes_of", "locate"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def locate(exc: BaseException, prefer: str | None = None) -> str:
    """'file:line' of the frame that raised, preferring frames in `prefer` (the user's file)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    chosen = None
    for fr in frames:
        if prefer and Path(fr.filename).resolve() == Path(prefer).resolve():
            chosen = fr
    if chosen is None:
        user = [fr for fr in frames if "site-packages" not in fr.filename and "/runner/" not in fr.filename]
        chosen = (user or frames or [None])[-1]
    return f"{chosen.filename}:{chosen.lineno}" if chosen else "?"


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def import_file(path: Path, module_name: str) -> Any:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ProblemError("import", str(path), "not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = mod
    spec.loader.exec_module(mod)
    return mod


def _shapes_factory(spec: ProblemSpec):
    """Inputs declared by shape (repository config) rather than by a factory function."""
    dtype = DTYPES[spec.dtype or "float32"]
    shapes = [tuple(s) for s in spec.input_shapes or []]
    return lambda: [torch.rand(s, dtype=dtype) for s in shapes]


@dataclass
class LoadedProblem:
    spec: ProblemSpec
    file: Path
    module: Any
    model_cls: type
    get_inputs: Any
    get_second_inputs: Any | None
    init_args: list
    init_kwargs: dict

    @property
    def tolerance(self) -> tuple[float, float]:
        atol, rtol = DEFAULT_TOLERANCE[self.spec.dtype or "float32"]
        return (self.spec.atol if self.spec.atol is not None else atol, self.spec.rtol if self.spec.rtol is not None else rtol)

    def shape_sets(self) -> int:
        return 2 if self.get_second_inputs is not None else 1

    def source(self) -> str:
        return self.file.read_text()


def load(spec: ProblemSpec) -> LoadedProblem:
    """Import the problem. Raises ProblemError naming file and line."""
    if spec.root:
        sys.path.insert(0, str(Path(spec.root).resolve()))
    if spec.path:
        file = Path(spec.path).resolve()
        if not file.is_file():
            raise ProblemError("import", str(file), "no such file")
        name = "fusebot_problem_" + hashlib.sha256(str(file).encode()).hexdigest()[:12]
        loader = lambda: import_file(file, name)  # noqa: E731
    elif spec.module:
        loader = lambda: importlib.import_module(spec.module)  # noqa: E731
        file = None
    else:
        raise ProblemError("import", spec.name, "the problem names neither a file nor a module")
    try:
        mod = loader()
    except ProblemError:
        raise
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything, SystemExit included
        raise ProblemError("import", locate(exc, str(file) if file else None), _cause(exc)) from None
    file = file or Path(mod.__file__).resolve()
    try:
        model_cls = getattr(mod, spec.class_name)
        # a module that adopted a fusebot drop-in (runner/results/adoption.py) binds the name to the drop-in's
        # subclass: the problem is the class it replaced
        model_cls = vars(model_cls).get("fusebot_original", model_cls)
    except AttributeError:
        raise ProblemError("import", str(file), f"defines no class {spec.class_name!r}") from None
    try:
        get_inputs = _shapes_factory(spec) if spec.input_shapes else resolve(mod, spec.inputs)
        second = resolve(mod, spec.second_inputs) if spec.second_inputs is not None else None
        init_factory = None
        if spec.init_inputs and (":" in spec.init_inputs or hasattr(mod, spec.init_inputs)):
            init_factory = resolve(mod, spec.init_inputs)
    except (AttributeError, ImportError) as exc:
        raise ProblemError("import", str(file), f"input factory not found: {exc}") from None
    init_args = list(spec.init_args)
    if init_factory is not None and not init_args:
        try:
            init_args = list(init_factory())
        except BaseException as exc:  # noqa: BLE001
            raise ProblemError("init inputs", locate(exc, str(file)), _cause(exc)) from None
    return LoadedProblem(spec, file, mod, model_cls, get_inputs, second, init_args, dict(spec.init_kwargs))


def strict_fp32() -> None:
    """fp32 means fp32: no TF32 in matmuls or convolutions, for the reference, the baselines and candidates alike.
    Called by every child before any user code runs."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def distribution_label(scale: float, offset: float) -> str:
    return f"randn*{scale:g}{offset:+g}"


# Edge values an edge trial puts into every floating input (runner.harness.plan): signed zeros, the dtype's
# denormals and least normal, the exact boundaries of the usual piecewise functions (relu, hardtanh, hardsigmoid and
# hardswish, relu6), and magnitudes past the tails where approximations stop (a GELU or a tanh clamped or switched at
# |x| = 24) yet under float32's overflow of exp.
EDGE_VALUES = (0.0, -0.0, "denormal", "-denormal", "tiny", "-tiny", 1.0, -1.0, 3.0, -3.0, 6.0, -6.0, 30.0, -30.0,
               60.0, -60.0)
EDGE_EVERY = 8  # one element in this many (at positions drawn from the trial's seed) takes an edge value


def edge_values(x: torch.Tensor, seed: int) -> torch.Tensor:
    """`x` with one element in EDGE_EVERY, at positions drawn from `seed`, set to one of EDGE_VALUES."""
    info = torch.finfo(x.dtype)
    named = {"denormal": info.tiny / 4, "-denormal": -info.tiny / 4, "tiny": info.tiny, "-tiny": -info.tiny}
    table = torch.tensor([named.get(v, v) if isinstance(v, str) else v for v in EDGE_VALUES], dtype=x.dtype,
                         device=x.device)
    gen = torch.Generator(device=x.device).manual_seed(seed ^ 0xED6E)
    draw = torch.randint(0, 256, x.shape, generator=gen, dtype=torch.uint8, device=x.device)
    at = draw < 256 // EDGE_EVERY
    x = x.clone()
    x[at] = table[(draw[at] % len(EDGE_VALUES)).long()]
    return x


NONFINITE_VALUES = (float("nan"), float("inf"), float("-inf"))


def nonfinite_values(x: torch.Tensor, seed: int) -> torch.Tensor:
    """`x` with NaN, +inf and -inf at three positions drawn from `seed` (as many as it has elements): few enough that
    most of a reduction's rows stay finite and are compared as usual, while those it reaches must be non-finite
    where the reference's are. The positions are drawn one at a time (distinct), in constant host memory: a
    permutation of a 2^29-element input's positions took 4 GiB of host memory in each process that drew it (on the
    H200, such a problem's candidates were SIGKILLed in this trial, and verified once the permutation was gone)."""
    n = x.numel()
    gen = torch.Generator(device="cpu").manual_seed(seed ^ 0x1AF)
    at: list[int] = []
    while len(at) < min(n, len(NONFINITE_VALUES)):
        i = int(torch.randint(0, n, (1,), generator=gen))
        if i not in at:
            at.append(i)
    if not at:
        return x
    x = x.clone()
    flat = x.view(-1)
    for k, i in enumerate(at):
        flat[i] = NONFINITE_VALUES[k]
    return x


def make_inputs(
    problem: LoadedProblem, seed: int, *, shape_set: int, randn: tuple[float, float] | None, device: str,
    edge: bool = False, nonfinite: bool = False,
) -> list[Any]:
    """The inputs of one trial, identical in every process given the same seed and device.

    The factory runs under `torch.device(device)` so that large inputs are drawn where they are used. With `randn`
    = (scale, offset), each floating tensor is redrawn as randn*scale+offset (a non-uniform distribution beside the
    factory's own torch.rand); integer tensors (indices, labels) keep the factory's values. With `edge`, edge values
    are put into every floating tensor (`edge_values`); with `nonfinite`, NaN and both infinities
    (`nonfinite_values`).
    """
    factory = problem.get_inputs if shape_set == 0 else problem.get_second_inputs
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            raw = list(factory())
    except BaseException as exc:  # noqa: BLE001
        raise ProblemError("inputs" if shape_set == 0 else "second inputs", locate(exc, str(problem.file)),
                           _cause(exc)) from None
    dtype = DTYPES.get(problem.spec.dtype) if problem.spec.dtype else None
    gen = torch.Generator(device=device).manual_seed(seed ^ 0x5EED)
    out = []
    for x in raw:
        if isinstance(x, torch.Tensor):
            x = x.to(device)
            if x.is_floating_point():
                if dtype is not None:
                    x = x.to(dtype)
                if randn is not None:
                    scale, offset = randn
                    x = (torch.randn(x.shape, generator=gen, device=device, dtype=torch.float32) * scale + offset).to(x.dtype)
                if edge:
                    x = edge_values(x, seed + len(out))
                if nonfinite:
                    x = nonfinite_values(x, seed + len(out))
            x = x.contiguous()
        out.append(x)
    return out


def build_model(problem: LoadedProblem, cls: type, seed: int, device: str) -> torch.nn.Module:
    """Instantiate `cls` with the problem's init arguments under a fixed seed (KernelBench's convention: the same
    seed gives the reference and a candidate the same parameters)."""
    torch.manual_seed(seed)
    model = cls(*problem.init_args, **problem.init_kwargs)
    dtype = DTYPES.get(problem.spec.dtype) if problem.spec.dtype else None
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
        if dtype is not None:
            model = model.to(dtype)
        model.eval()
    return model


def bytes_of(values: Any) -> int:
    """Bytes of every tensor in a (nested) structure."""
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, list | tuple):
        return sum(bytes_of(v) for v in values)
    if isinstance(values, dict):
        return sum(bytes_of(v) for v in values.values())
    return 0
