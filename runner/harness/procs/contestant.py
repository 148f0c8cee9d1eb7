"""The candidate's own process. It draws each trial's inputs from the seed the parent sends, runs the candidate,
writes the outputs as raw bytes for the judge, and reports what the candidate changed around it. It never sees a
reference output, nor the secret the seeds come from.

Commands (JSON): warm (optional, before init), init, trial, time, batch, exit.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

from runner.contract import Candidate, ProblemSpec
from runner.harness import dropin, timing, verify
from runner.harness.guards import Guard
from runner.harness.problem import ProblemError, build_model, load, make_inputs, strict_fp32
from runner.harness.procs import batch, calls, ipc
from runner.harness.procs.abi import KernelLibrary, as_tensor_args
from runner.harness.procs.calls import Capture, FreshInputs, Samples, call_once, own_code_ran, poison_allocator
from runner.harness.procs.process import serve
from runner.harness.procs.profile import Phases, profile_kernels
from runner.harness.sandbox import confine

_IMPORTED_AT = time.time()  # (wall clock, comparable with the parent's: the process started, its imports done)
_clone = torch.Tensor.clone
_equal = torch.equal
_empty = torch.empty
_sync = torch.cuda.synchronize


class State:
    device = "cpu"
    problem = None
    candidate: Candidate | None = None
    model = None
    lib: KernelLibrary | None = None
    params: list = []
    dropin = None  # the drop-in module a PR would add for this kernel, built here: what the timings call
    guard: Guard | None = None
    inputs: list | None = None
    out_specs: list = []
    structure = "tensor"
    workdir = Path(".")
    ext_dirs: list[Path] = []
    timer_cfg = timing.TimerConfig()
    exported: list = []  # outputs handed to the judge through CUDA IPC, alive until the next request
    timed: tuple = ()  # the last timing's (Capture, FreshInputs), for the parent-clocked batch
    ipc_off: str | None = None  # why outputs go through files on this machine (no IPC)
    warmed = False  # confined and warmed up (by `warm`, or by `init` itself)
    confinement = None


def _watched() -> dict[str, object]:
    """This process's own code, watched like torch's: it calls the candidate, samples and writes its outputs."""
    return {"runner.harness.procs.contestant": sys.modules[__name__], "runner.harness.procs.calls": calls,
            "runner.harness.procs.batch": batch, "runner.harness.fingerprint": batch.fingerprint,
            "runner.harness.procs.calls.Samples": calls.Samples, "runner.harness.procs.calls.FreshInputs":
            calls.FreshInputs}


def _warm_up(device: str) -> None:
    """Start the runtime's own threads and pools before the snapshot, so they are not taken for the candidate's."""
    # The CPU's intra-op pool too, on every device: a problem's inputs are made on the CPU (a large torch.rand starts
    # the pool), and on the H100 a LayerNorm's 15 pool threads were taken for the candidate's own.
    torch.ones(1 << 22).add_(1.0).sum().item()
    x = torch.randn(1 << 16, device=device)
    (x @ x).item()
    torch.empty(1, device=device)
    importlib.import_module("torch._dynamo")  # its import (a drop-in's custom op's first call) rebinds manual_seed

    torch.randn(256, 256, device=device).softmax(-1).sum().item()
    if device.startswith("cuda"):
        profile_kernels(lambda: x.mul_(1.0), Path(os.getcwd()) / "warmup_trace.json")
        _sync()


def init(st: State, msg: dict) -> dict:
    phases = Phases(_IMPORTED_AT)
    reply = _init(st, msg, phases)
    reply["phases"] = dict(phases)
    return reply


def warm(st: State, msg: dict) -> dict:
    """A process started before its candidate is known (runner/harness/contestants.py's spares): confined, its device
    and runtime warmed up, it waits for the `init` that names its candidate. Nothing of a candidate has run in it."""
    phases = Phases(_IMPORTED_AT)
    _prepare(st, msg, phases)
    return {"ok": True, "phases": dict(phases)}


def _prepare(st: State, msg: dict, phases: Phases) -> None:
    st.workdir = Path(os.getcwd()).resolve()
    st.ext_dirs = [Path(p).resolve() for p in msg.get("extra_write", [])]
    if msg["device"].startswith("cuda"):
        with contextlib.suppress(ipc.IpcUnavailable):
            ipc.preload()  # the driver library is opened before confinement, like torch
    st.confinement = confine(st.workdir, extra_write=st.ext_dirs,
                             address_space_bytes=msg.get("address_space_bytes"))
    st.device = msg["device"]
    st.timer_cfg = timing.TimerConfig(**msg.get("timer", {}))
    strict_fp32()
    timing.pin(msg.get("cores"))
    phases.lap("confine")
    if st.device.startswith("cuda"):
        torch.cuda.init()
    phases.lap("device")
    _warm_up(st.device)
    phases.lap("warm_up")
    st.warmed = True


def _init(st: State, msg: dict, phases: Phases) -> dict:
    if not st.warmed:
        _prepare(st, msg, phases)
    elif msg["device"] != st.device or msg.get("extra_write"):
        return {"ok": False, "error": "a warmed process was sent a candidate for another device or more paths"}
    confinement = st.confinement
    st.candidate = Candidate.model_validate(msg["candidate"])
    try:
        st.problem = load(ProblemSpec.model_validate(msg["problem"]))
    except ProblemError as exc:
        return {"ok": False, "error": f"problem: {exc}"}
    torch.set_grad_enabled(False)
    st.guard = Guard(_watched())
    reasons: list[str] = []
    try:
        if st.candidate.format == "kernelbench":
            path = st.workdir / "candidate.py"
            spec = importlib.util.spec_from_file_location("fusebot_candidate", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["fusebot_candidate"] = mod
            spec.loader.exec_module(mod)
            if not hasattr(mod, "ModelNew"):
                return {"ok": True, "reasons": ["load: the candidate defines no ModelNew"]}
            st.model = build_model(st.problem, mod.ModelNew, msg["init_seed"], st.device)
        else:
            st.lib = KernelLibrary(Path(msg["library"]))
            ref = build_model(st.problem, st.problem.model_cls, msg["init_seed"], st.device)
            st.params = list(ref.state_dict().values()) if isinstance(ref, torch.nn.Module) else []
    except BaseException as exc:  # noqa: BLE001 - a candidate that fails to load (or exits) is a verdict
        return {"ok": True, "reasons": [failure("load", exc, st.device)]}
    phases.lap("load")
    reasons += st.guard.violations()
    st.guard.restore_flags()
    if st.lib is not None and not reasons and isinstance(st.problem.model_cls, type) \
            and issubclass(st.problem.model_cls, torch.nn.Module):
        try:
            st.dropin = _build_dropin(st, msg["init_seed"])
        except Exception as exc:  # noqa: BLE001 - a kernel whose drop-in cannot run is not one a PR can ship
            return {"ok": True, "reasons": [f"drop-in: {type(exc).__name__}: {str(exc)[-2000:]}"]}
        st.guard = Guard(_watched())  # (registering the drop-in's custom op is fusebot's doing, not the candidate's)
        phases.lap("dropin")
    return {"ok": True, "reasons": reasons, "confinement": confinement.as_dict()}


def _build_dropin(st: State, init_seed: int) -> torch.nn.Module:
    """The module a PR would add for this kernel (runner/harness/dropin.py's source, the reference beside it), bound to the
    library built here, with the reference's parameters: the timings call it as a user would (its forward, state
    lookup, output allocation, descriptors), not the bare library."""
    spec = st.problem.spec
    folder = st.workdir / "dropin"
    folder.mkdir(exist_ok=True)
    if spec.path:
        (folder / dropin.REFERENCE_FILE).write_bytes(Path(spec.path).read_bytes())
    (folder / dropin.DROPIN_FILE).write_text(dropin.dropin_source(spec, st.candidate.backend,
                                                                  st.candidate.extra_cflags))
    name = f"fusebot_timed_dropin_{os.getpid()}"
    mod_spec = importlib.util.spec_from_file_location(name, folder / dropin.DROPIN_FILE)
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = mod
    mod_spec.loader.exec_module(mod)
    mod._LIB = mod._bind(st.lib.path)
    mod.STRICT = True  # a call its guard refuses raises here: what is timed and verified is the kernel
    return build_model(st.problem, getattr(mod, spec.class_name), init_seed, st.device)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    x, y = a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    step = 1 << 28  # a chunk at a time: torch.equal over a 7.5 GB input allocated 7 GB more on the H100 (OOM)
    return all(_equal(x[i:i + step], y[i:i + step]) for i in range(0, x.numel(), step))


def _call(st: State, inputs: list):
    """The kernel library called directly (where there is no drop-in module), or the candidate's module."""
    if st.lib is not None:
        outs = [_empty(s["shape"], dtype=verify.DTYPE_NAMES[s["dtype"]], device=st.device) for s in st.out_specs]
        stream = torch.cuda.current_stream().cuda_stream if st.device.startswith("cuda") else None
        st.lib(as_tensor_args(inputs, st.device) + st.params, outs, stream)
        return outs[0] if st.structure == "tensor" else tuple(outs)
    return st.model(*inputs)


def _write_outputs(st: State, out, tag: str) -> tuple[list[dict], str]:
    flat, structure = verify.flatten(out)
    metas = []
    for k, t in enumerate(flat):
        meta = verify.describe(t)
        if meta["tensor"] and meta["exact_tensor"] and meta["layout"] == "torch.strided":
            if t.is_cuda and st.ipc_off is None:
                data = t.detach().contiguous()
                if data.dtype == torch.bool:
                    data = data.view(torch.uint8)
                try:
                    meta["ipc"] = ipc.export(data)
                    st.exported.append(data)
                    metas.append(meta)
                    continue
                except ipc.IpcUnavailable as exc:
                    st.ipc_off = str(exc)
            path = st.workdir / f"out_{tag}_{k}.bin"
            verify.write_tensor(t, path)
            meta["file"] = str(path)
        metas.append(meta)
    return metas, structure


def _inputs_for(st: State, msg: dict) -> list:
    randn = tuple(msg["randn"]) if msg.get("randn") else None
    fresh = make_inputs(st.problem, msg["seed"], shape_set=msg["shape_set"], randn=randn, device=st.device,
                        edge=bool(msg.get("edge")), nonfinite=bool(msg.get("nonfinite")))
    old = st.inputs
    if msg.get("reuse") and old is not None and len(old) == len(fresh) and all(
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        for a, b in zip(old, fresh, strict=True)
    ):
        for a, b in zip(old, fresh, strict=True):
            a.copy_(b)  # same buffers, new values: a result cached on pointers or shapes is now stale
        return old
    st.inputs = fresh
    return fresh


class _Clock:
    """Seconds per step of a trial, reported to the parent (where a large problem's verification time goes)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._t, 4)
        self._t = now


def trial(st: State, msg: dict) -> dict:
    st.out_specs, st.structure = msg["out_specs"], msg["structure"]
    clock = _Clock()
    inputs = _inputs_for(st, msg)
    pristine = [_clone(x) if isinstance(x, torch.Tensor) else x for x in inputs]
    clock.lap("inputs")
    reasons: list[str] = []
    cuda = st.device.startswith("cuda")
    profiled: dict = {}
    capture = Capture(_timed_call(st, inputs)[1])  # what timing calls, called as timing calls it
    poison = lambda: poison_allocator(st.out_specs, st.device)  # noqa: E731
    try:
        # The first call of a profiled trial runs under the profiler: which kernels ran, on which streams.
        if msg.get("profile") and cuda:
            out, profiled["kernels"], profiled["marker_stream"] = profile_kernels(
                lambda: call_once(st.device, capture, poison), st.workdir / f"trace_{msg['trial']}.json")
        elif msg.get("profile") and st.lib is None:
            out, profiled["own_code_ran"] = own_code_ran([st.workdir, *st.ext_dirs],
                                                          lambda: call_once(st.device, capture, poison))
        else:
            out = call_once(st.device, capture, poison)
        if cuda:
            _sync()
    except BaseException as exc:  # noqa: BLE001 - the candidate's failure is data (SystemExit included)
        return {"ok": True, "reasons": [failure("runtime", exc, st.device)], "fatal": cuda}
    clock.lap("run")
    reasons += st.guard.violations()
    st.guard.restore_flags()
    for i, (x, p) in enumerate(zip(inputs, pristine, strict=True)):
        if isinstance(x, torch.Tensor) and not _same_bytes(x, p):
            reasons.append(f"input-mutation: the candidate modified input {i} in place")
    clock.lap("checks")
    metas, structure = _write_outputs(st, out, f"{msg['trial']}_a")
    del out
    clock.lap("write")
    reply = {"outputs": metas, "structure": structure, "reasons": reasons, **profiled, "seconds": clock.laps,
             "handoff": "cuda-ipc" if any("ipc" in m for m in metas) else f"files ({st.ipc_off or 'host tensors'})"}
    if msg.get("twice"):
        for x, p in zip(inputs, pristine, strict=True):
            if isinstance(x, torch.Tensor):
                x.copy_(p)
        try:
            out2 = call_once(st.device, capture, poison)
            if cuda:
                _sync()
        except BaseException as exc:  # noqa: BLE001
            return {"ok": True, "reasons": [failure("runtime", exc, st.device, "second run: ")], "fatal": cuda}
        reply["second_run"], _ = _write_outputs(st, out2, f"{msg['trial']}_b")
        clock.lap("second_run")
    return reply


def time_(st: State, msg: dict) -> dict:
    """Time the candidate on fresh inputs for every call (runner.harness.procs.calls), and write a sample of the
    outputs of a few timed calls, chosen after the last one, for the judge to check."""
    st.exported.clear()
    st.out_specs, st.structure = msg["out_specs"], msg["structure"]  # the first shape's, like the inputs below
    st.inputs = None  # freed before the new ones are made: two sets of a 7 GB problem's inputs do not fit beside it
    fresh = FreshInputs(make_inputs(st.problem, msg["seed"], shape_set=0, randn=None, device=st.device), msg["seed"])
    st.inputs = fresh.work
    call, fn = _timed_call(st, fresh.work)
    capture = Capture(fn)
    samples = Samples(capture, fresh)

    def before() -> None:
        fresh.next()
        poison_allocator(st.out_specs, st.device)

    st.timed = (capture, fresh)  # the parent-clocked batch's calls: fresh inputs, no allocator fill (it syncs)
    batch.fingerprint.warm([verify.DTYPE_NAMES[s["dtype"]] for s in st.out_specs], st.device)
    try:
        result = timing.Timer(st.device, st.timer_cfg).measure(capture, before=before, after=samples.take)
    except BaseException as exc:  # noqa: BLE001 - the candidate's failure is data
        return {"reasons": [failure("runtime", exc, st.device, "while timing: ")]}
    result.call = call
    reasons = st.guard.violations()
    checked = []
    for record in samples.chosen():
        outs = []
        for j, o in enumerate(record["outputs"]):
            if o is not None:
                path = st.workdir / f"timed_{record['call']}_{j}.bin"
                verify.write_tensor(o["values"], path)
                o = {"step": o["step"], "offset": o["offset"], "file": str(path), **verify.describe(o["values"])}
            outs.append(o)
        checked.append({"call": record["call"], "scale": record["scale"], "outputs": outs})
    return {"timing": result.model_dump(), "reasons": reasons, "samples": checked}


def _timed_call(st: State, inputs: list):
    """What a call runs, verified or timed, and its name for Timing.call: the drop-in's forward where there is one
    (a fast-format kernel of a module), the candidate itself otherwise (its library, or its module)."""
    if st.dropin is not None:
        return "drop-in", lambda: st.dropin(*inputs)
    return ("library" if st.lib is not None else "module"), lambda: _call(st, inputs)


def batch_(st: State, msg: dict) -> dict:
    """The parent-clocked batch (runner.harness.procs.batch): back-to-back calls, each output fingerprinted."""
    capture, fresh = st.timed
    return batch.run(capture, fresh, msg, st.device)


def _trial_releasing(st: State, msg: dict) -> dict:
    """A trial, then its freed blocks given back to the device (the next trial poisons the allocator afresh): a 7 GB
    problem's trial leaves tens of GB cached in this process otherwise, beside the judge's on the same GPU. A
    sticky CUDA error the candidate left (an out-of-bounds write) surfaces here at the latest: a crash verdict."""
    st.exported.clear()  # the judge has copied the previous trial's outputs before this request was sent
    reply = trial(st, msg)
    if torch.cuda.is_initialized():
        try:
            torch.cuda.empty_cache()
            _sync()
        except BaseException as exc:  # noqa: BLE001 - the candidate's kernel broke this process's CUDA context
            return {"ok": True, "reasons": [failure("runtime", exc, st.device, "after the call: ")], "fatal": True}
    return reply


def failure(name: str, exc: BaseException, device: str, where: str = "") -> str:
    """A reason for an exception raised by (or because of) the candidate's code: a CUDA error that poisons the
    process's context is a crash, whatever step it surfaced in; the rest keep `name` (load, runtime)."""
    text = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    if device.startswith("cuda") and ("CUDA error" in text or type(exc).__name__ == "AcceleratorError"):
        return f"crash: {where}{text} (a CUDA error that poisons the process's context: the kernel broke it)"
    if isinstance(exc, SystemExit):
        return f"crash: {where}the candidate called exit ({text})"
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return f"crash: {where}the process ran out of file descriptors ({text})"
    return f"{name}: {where}{text}"


HANDLERS = {"warm": warm, "init": init, "trial": _trial_releasing, "time": time_, "batch": batch_}

if __name__ == "__main__":
    serve(HANDLERS, State())
