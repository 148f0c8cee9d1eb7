"""The judge: the reference in its own process. It computes reference outputs on clones of each trial's inputs,
keeps them out of the candidate's reach (in its own memory only), compares what the candidate's process wrote,
and times the eager and torch.compile baselines.

Commands (JSON): init, prepare, check, timed_check, steps, batch_check, baselines, profile, bandwidth, exit.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import torch  # imported before anything untrusted

from runner.contract import ProblemSpec
from runner.harness import timing, verify
from runner.harness.oracle import oracle_model, oracle_outputs
from runner.harness.problem import ProblemError, build_model, bytes_of, load, locate, make_inputs, strict_fp32
from runner.harness.procs import batch
from runner.harness.procs.ipc import IpcUnavailable
from runner.harness.procs.process import serve
from runner.harness.sandbox import confine


class State:
    problem = None
    model = None
    device = "cpu"
    refs: dict[int, list] = {}
    oracle = None  # the reference module in float64 (runner.harness.oracle), None where it cannot be
    oracle_note: str | None = None  # why there is no oracle
    oracles: dict[int, list] = {}  # per trial, per output: the oracle's output, or None
    tols: dict[int, list[tuple[float, float]]] = {}  # per trial, per output: the (atol, rtol) its check uses
    prev_ref: list | None = None  # verify.sample() of each output of the previous trial
    nonfinite: set[int] = set()  # the trials whose inputs hold NaN and infinities (verify.spread_nonfinite)
    twins: dict[int, tuple[list, list, int]] = {}  # per non-finite trial: `masked_twin`'s outputs, oracles, count
    timer_cfg = timing.TimerConfig()
    steps: tuple = ()  # (seed, output specs, runner.harness.procs.batch.Steps) of the cross-check under way


def _problem_error(exc: ProblemError) -> dict:
    return {"ok": False, "problem_error": {"stage": exc.stage, "where": exc.where, "cause": exc.cause}}


# What a lost or unusable device says, whichever line of the user's forward was running: a machine fault, not theirs.
DEVICE_FAULTS = ("no CUDA GPUs", "CUDA-capable device", "CUDA driver", "ECC error", "GPU is lost",
                 "busy or unavailable")


def device_fault(exc: BaseException) -> bool:
    return any(words in str(exc) for words in DEVICE_FAULTS)


def reference_failure(st: State, exc: BaseException) -> BaseException:
    """The exception the reference's forward raised, as what it is: the user's mistake (a ProblemError naming their
    file and line), or, where the device itself failed, the exception unchanged (the parent's MachineError)."""
    if device_fault(exc):
        return exc
    return ProblemError("reference", locate(exc, str(st.problem.file)), f"{type(exc).__name__}: {exc}")


def init(st: State, msg: dict) -> dict:
    workdir = Path(os.getcwd())
    extra = [Path(p) for p in msg.get("extra_write", [])]
    confinement = confine(workdir, extra_write=extra)
    st.device = msg["device"]
    strict_fp32()
    timing.pin(msg.get("cores"))
    if st.device.startswith("cuda"):
        torch.cuda.init()
    st.timer_cfg = timing.TimerConfig(**msg.get("timer", {}))
    try:
        st.problem = load(ProblemSpec.model_validate(msg["problem"]))
        st.model = build_model(st.problem, st.problem.model_cls, msg["init_seed"], st.device)
    except ProblemError as exc:
        return _problem_error(exc)
    except BaseException as exc:  # noqa: BLE001 - the constructor is the user's code
        if device_fault(exc):
            raise
        return _problem_error(ProblemError("init", locate(exc, str(st.problem.file) if st.problem else None),
                                           f"{type(exc).__name__}: {exc}"))
    st.oracle, st.oracle_note = oracle_model(st.model)
    atol, rtol = st.problem.tolerance
    return {"confinement": confinement.as_dict(), "source": st.problem.source(), "file": str(st.problem.file),
            "atol": atol, "rtol": rtol, "shape_sets": st.problem.shape_sets(),
            "param_bytes": sum(t.numel() * t.element_size() for t in st.model.state_dict().values())
            if isinstance(st.model, torch.nn.Module) else 0,
            "environment": _environment(st.device)}


def _environment(device: str) -> dict:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        fb_version = version("fusebot")
    except PackageNotFoundError:
        fb_version = "unknown"
    from runner.harness.build import _cpu_model

    env = {"device": device, "torch": torch.__version__, "python": platform.python_version(), "fusebot": fb_version,
           "cpu": _cpu_model()}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        try:
            import subprocess

            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, IndexError, subprocess.TimeoutExpired):
            env["driver"] = None
    return env


def _run_reference(st: State, inputs: list) -> list:
    clones = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.no_grad():
        try:
            out = st.model(*clones)
        except BaseException as exc:  # noqa: BLE001 - the forward is the user's code
            raise reference_failure(st, exc) from None
    if st.device.startswith("cuda"):
        torch.cuda.synchronize()
    flat, structure = verify.flatten(out)
    return flat, structure


def _fingerprint(t: torch.Tensor) -> bytes:
    """A few thousand evenly spaced elements plus the sum, computed on the device: enough to tell whether two
    outputs differ, without copying gigabytes to the host."""
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return b""
    step = max(1, flat.numel() // 4096)
    sample = flat[::step].contiguous()
    total = flat.double().sum() if flat.is_floating_point() else flat.long().sum()
    return sample.view(torch.uint8).cpu().numpy().tobytes() + repr(float(total)).encode()


class _Undefined(Exception):
    """The reference is not defined on an edge trial's inputs: the trial is skipped."""


def _run_edge_reference(st: State, inputs: list) -> tuple[list, str]:
    """The reference on an edge or non-finite trial's inputs; a forward that refuses them (a check of its own) is not
    defined there, which is no fault of the user's problem."""
    try:
        return _run_reference(st, inputs)
    except ProblemError as exc:
        raise _Undefined(f"the reference refused edge values ({exc.cause[:200]})") from None


def _undefined(flat: list, oracles: list) -> str | None:
    """Why the reference is not defined on an edge trial's (finite) inputs, or None: an output it makes non-finite
    (an overflow in its dtype, a log of a negative), or one its float64 oracle makes non-finite."""
    for i, (t, o) in enumerate(zip(flat, oracles, strict=True)):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return f"output {i} of the reference is not finite on edge values"
        if isinstance(o, torch.Tensor) and not bool(torch.isfinite(o).all()):
            return f"output {i} of the float64 oracle is not finite on edge values"
    return None


def prepare(st: State, msg: dict) -> dict:
    t0 = time.perf_counter()
    randn = tuple(msg["randn"]) if msg.get("randn") else None
    try:
        inputs = make_inputs(st.problem, msg["seed"], shape_set=msg["shape_set"], randn=randn, device=st.device,
                             edge=bool(msg.get("edge")), nonfinite=bool(msg.get("nonfinite")))
        odd = msg.get("edge") or msg.get("nonfinite")
        if msg.get("nonfinite"):
            st.nonfinite.add(msg["trial"])
        flat, structure = _run_edge_reference(st, inputs) if odd else _run_reference(st, inputs)
    except ProblemError as exc:
        return _problem_error(exc)
    except _Undefined as exc:
        return {"skipped": str(exc)}
    specs, digest = [], hashlib.sha256()
    near_constant, atols, tols, notes = True, [], [], []
    lo, hi = float("inf"), float("-inf")  # over every output: a scalar (a loss) has no range of its own
    oracles, why_not = oracle_outputs(st.oracle, inputs, flat) if msg["trial"] >= 0 else ([None] * len(flat), None)
    if msg.get("edge"):
        why = _undefined(flat, oracles)
        if why:
            return {"skipped": why}
    why_not = why_not or st.oracle_note
    for i, t in enumerate(flat):
        if not isinstance(t, torch.Tensor):
            return _problem_error(ProblemError("reference", str(st.problem.file),
                                               f"forward returned a {type(t).__name__}, not tensors"))
        specs.append({"shape": list(t.shape), "dtype": str(t.dtype)})
        digest.update(_fingerprint(t))
        # the problem's dtype is its outputs': a bf16 output is judged as bf16 whatever the problem declared
        atol, rtol = verify.tolerance_for(t.dtype, st.problem.spec.atol, st.problem.spec.rtol)
        atols.append(verify.effective_atol(atol, verify.magnitude(t)))
        tols.append((atols[-1], rtol))
        if t.is_floating_point() and oracles[i] is None and msg["trial"] >= 0:
            notes.append(f"output {i}: no float64 oracle ({why_not or 'none'}): compared with the reference in "
                         f"{t.dtype} at atol={atol:g} rtol={rtol:g}")
        if atols[-1] < atol:
            notes.append(f"output {i}: every value is below atol={atol:g} (largest {atols[-1] / atol:.3g}), so an "
                         f"all-zeros output would pass: checked with atol={atols[-1]:.3g} (atol x that magnitude)")
        spread = 0.0
        if t.numel() and t.dtype != torch.bool:
            # On the same evenly spaced sample as the fingerprint: a mask over a 7.5 GB output would need tens of GB.
            # Integer outputs (argmax, indices) count too: they are not constant just because they are not floats.
            sample = t.detach().reshape(-1)[:: max(1, t.numel() // 4096)].double()
            finite = sample[torch.isfinite(sample)]
            if finite.numel():
                spread = float(finite.max() - finite.min())
                lo, hi = min(lo, float(finite.min())), max(hi, float(finite.max()))
        elif t.numel():
            spread = float(t.any()) - float(t.all())
        near_constant = near_constant and spread <= atols[-1]
    if st.refs:  # the previous trial's outputs, kept as evenly spaced samples (not a second copy of 7 GB)
        st.prev_ref = [verify.sample(t) for t in st.refs.pop(max(st.refs))]
    st.refs = {msg["trial"]: flat}
    st.oracles = {msg["trial"]: oracles}
    st.tols = {msg["trial"]: tols}
    st.twins = {}
    if msg.get("nonfinite"):
        twin = masked_twin(st, inputs, flat)
        if twin is not None:
            st.twins[msg["trial"]] = twin
    return {"outputs": specs, "structure": structure, "digest": digest.hexdigest(),
            "near_constant": near_constant, "tolerance_notes": notes,
            "atol_min": min(atols, default=st.problem.tolerance[0]),
            "value_span": [lo, hi] if lo <= hi else None,
            "input_bytes": bytes_of(inputs), "output_bytes": bytes_of(flat),
            "seconds": round(time.perf_counter() - t0, 4)}


# finite values put where a non-finite one was: both signs, small and large (a ReLU of x * 2 + b is 0 at both 0.75 and
# -1.5 where b < -1.5, never at both 1000 and -1000), each exact in every float dtype
PROBES = (0.75, -1.5, 1000.0, -1000.0)


def masked_twin(st: State, inputs: list, flat: list) -> tuple[list, list, int] | None:
    """On a non-finite trial: the module's outputs (and their oracle's) with each NaN or infinity that the module's
    own mask discards replaced by a finite value, and how many there were; None where it discards none.

    A value is discarded where the module's output is exactly the same whichever finite value sits there (probed with
    every one of PROBES, the other non-finite positions set to the first): a padding mask's x * 0, an additive mask's
    score + finfo.min. The module still spreads a NaN from there (NaN * 0 is NaN) where a kernel that skips masked
    elements does not read it; such a kernel is right on every finite input, and matches this twin. A value the
    output depends on (a ReLU's argument) is never discarded, so a kernel that swallows it still fails."""
    spots = [(k, i) for k, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()
             for i in (~torch.isfinite(x)).reshape(-1).nonzero().flatten().tolist()]
    if not spots:
        return None

    def filled(values: dict[tuple[int, int], float]) -> list:
        out = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        for (k, i), v in values.items():
            out[k].view(-1)[i] = v
        return out

    def outputs(values: dict[tuple[int, int], float]) -> list:
        return _run_reference(st, filled(values))[0]

    def same(a: list, b: list) -> bool:
        return all(verify.matches(x, y, 0.0, 0.0) if isinstance(x, torch.Tensor) else x == y
                   for x, y in zip(a, b, strict=True))

    first = PROBES[0]
    try:
        base = outputs(dict.fromkeys(spots, first))
        if all(same(base, outputs(dict.fromkeys(spots, v))) for v in PROBES[1:]):
            masked = spots
        else:
            masked = [s for s in spots
                      if all(same(base, outputs(dict.fromkeys(spots, first) | {s: v})) for v in PROBES[1:])]
        if not masked:
            return None
        twin_inputs = filled(dict.fromkeys(masked, first))
        twin = base if len(masked) == len(spots) else _run_reference(st, twin_inputs)[0]
    except ProblemError:  # the forward refuses the probe (a check of its own): nothing is discarded
        return None
    if same(twin, flat):  # discarded, and not spread either: nothing for a candidate to differ on
        return None
    return twin, oracle_outputs(st.oracle, twin_inputs, twin)[0], len(masked)


def against_twin(st: State, trial: int, i: int, o: torch.Tensor) -> str | None:
    """A note where output `i` of a non-finite trial, refused against the reference, matches the module with the
    NaN and infinities its mask discards made finite (`masked_twin`); None otherwise."""
    if trial not in st.twins:
        return None
    outs, oracles, count = st.twins[trial]
    r, (atol, rtol) = outs[i], st.tols[trial][i]
    if not isinstance(r, torch.Tensor) or not r.is_floating_point():
        return None
    cmp = (verify.compare_to_oracle(r, oracles[i], o, atol, rtol, i) if oracles[i] is not None
           else verify.compare_values(r, o, atol, rtol, i))
    kept, spread = verify.spread_nonfinite(r, o, cmp.reasons, i) if cmp.reasons else ([], None)
    if kept:
        return None
    return (f"masked non-finite: output {i} matches the module with the {count} NaN or infinite input values its own "
            "mask discards made finite (its output is the same whatever finite value is there); the module spreads "
            "them through the mask (NaN x 0 is NaN), this candidate does not read them" + (f"; {spread}" if spread else ""))


def nonfinite_reasons(st: State, trial: int, i: int, r: torch.Tensor, o: torch.Tensor,
                      reasons: list[str]) -> tuple[list[str], str | None]:
    """Output `i` of a non-finite trial, refused for `reasons`: what stays refused, and a note where the module spreads
    the values (verify.spread_nonfinite) or its mask discards them (`against_twin`)."""
    kept, note = verify.spread_nonfinite(r, o, reasons, i)
    masked = against_twin(st, trial, i, o) if kept else None
    return ([], masked) if masked else (kept, note)


def _inside(file: str | None, directory: str) -> Path:
    """The candidate's process names its output files: only files in its own directory are read."""
    if not file:
        raise ValueError("no file was written for it")
    path, root = Path(file).resolve(), Path(directory).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"{file} is outside the candidate's directory")
    return path


def _read(meta: dict, directory: str, device: str) -> torch.Tensor:
    if meta.get("ipc") and device.startswith("cuda"):
        return verify.read_tensor(None, meta, device)
    return verify.read_tensor(_inside(meta.get("file"), directory), meta, device)


def check(st: State, msg: dict) -> dict:
    """Compare the candidate's outputs for `trial` (files + metadata its process wrote) with the reference."""
    t0 = time.perf_counter()
    ref, oracles, tols = st.refs[msg["trial"]], st.oracles[msg["trial"]], st.tols[msg["trial"]]
    reasons: list[str] = []
    if msg["structure"] != msg["expected_structure"]:
        reasons.append(f"output-type: the candidate returned {msg['structure']}, the reference {msg['expected_structure']}")
        return {"passed": False, "reasons": reasons}
    worst_abs = worst_rel = 0.0
    mismatched = numel = 0
    outs, notes = [], []
    for i, (r, meta) in enumerate(zip(ref, msg["outputs"], strict=True)):
        meta_reasons = verify.check_metadata(r, meta, i)
        if meta_reasons:
            reasons += meta_reasons
            if any(m.startswith(("shape", "output-type", "dtype")) for m in meta_reasons):
                continue
        try:
            o = _read(meta, msg["dir"], st.device)
        except (OSError, ValueError, KeyError, IpcUnavailable) as exc:
            reasons.append(f"output-type: output {i} could not be read: {exc}")
            continue
        outs.append(o)
        atol, rtol = tols[i]
        if oracles[i] is not None:
            cmp = verify.compare_to_oracle(r, oracles[i], o, atol, rtol, i)
        else:
            cmp = verify.compare_values(r, o, atol, rtol, i)
        kept = cmp.reasons
        if msg["trial"] in st.nonfinite and cmp.reasons:
            kept, note = nonfinite_reasons(st, msg["trial"], i, r, o, cmp.reasons)
            notes += [note] if note else []
        reasons += kept
        worst_abs = max(worst_abs, cmp.max_abs_err or 0.0)
        worst_rel = max(worst_rel, cmp.max_rel_err or 0.0)
        mismatched += cmp.mismatched
        numel += cmp.numel
        if kept and st.prev_ref is not None and i < len(st.prev_ref):
            if verify.matches(st.prev_ref[i], verify.sample(o), atol, rtol):
                reasons.append(f"stale-result: output {i} equals the previous trial's result, not this one's: "
                               "results cached or replayed (keyed on data pointers, ids or shapes)")
    for j, meta in enumerate(msg.get("second_run") or []):
        if j < len(outs):
            try:
                o2 = _read(meta, msg["dir"], st.device)
            except (OSError, ValueError, KeyError, IpcUnavailable) as exc:
                reasons.append(f"nondeterministic: second run's output {j} unreadable: {exc}")
                continue
            if not verify.matches(outs[j], o2, *tols[j]):
                diff = float((outs[j].double() - o2.double()).abs().nan_to_num(0).max())
                reasons.append(f"nondeterministic: a second run on the same inputs gave a different output {j} "
                               f"(max abs difference {diff:.3g})")
    return {"passed": not reasons, "reasons": reasons, "max_abs_err": worst_abs, "max_rel_err": worst_rel,
            "mismatched": mismatched, "numel": numel, "seconds": round(time.perf_counter() - t0, 4), "notes": notes}


def timed_check(st: State, msg: dict) -> dict:
    """Check samples of the outputs of timed calls: each call's inputs are the timing's inputs scaled by that call's
    factor (runner.harness.procs.calls.FreshInputs); the reference is run on them and the same elements compared,
    by the oracle's rule where there is an oracle."""
    base = make_inputs(st.problem, msg["seed"], shape_set=0, randn=None, device=st.device)
    reasons: list[str] = []
    for record in msg["samples"]:
        s = float(record["scale"])
        inputs = [torch.mul(x, s) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in base]
        flat, _ = _run_reference(st, inputs)
        oracles, _ = oracle_outputs(st.oracle, inputs, flat)
        if len(record["outputs"]) != len(flat):
            reasons.append(f"timer-escape: timed call {record['call']} returned {len(record['outputs'])} outputs, "
                           f"the reference {len(flat)}")
            continue
        for i, (r, meta) in enumerate(zip(flat, record["outputs"], strict=True)):
            if meta is None or not isinstance(r, torch.Tensor):
                continue
            try:
                got = _read(meta, msg["dir"], st.device)
            except (OSError, ValueError, KeyError, IpcUnavailable) as exc:
                reasons.append(f"timer-escape: timed call {record['call']}'s output {i} could not be read: {exc}")
                continue
            at = slice(int(meta["offset"]), None, int(meta["step"]))
            want = r.reshape(-1)[at][:got.numel()]
            if want.shape != got.shape or want.dtype != got.dtype:
                reasons.append(f"timer-escape: timed call {record['call']}'s output {i} is not the reference's "
                               f"shape or dtype")
                continue
            atol, rtol = verify.tolerance_for(r.dtype, st.problem.spec.atol, st.problem.spec.rtol)
            atol = verify.effective_atol(atol, verify.magnitude(r))
            if oracles[i] is not None:
                cmp = verify.compare_to_oracle(want, oracles[i].reshape(-1)[at][:got.numel()], got, atol, rtol, i)
            else:
                cmp = verify.compare_values(want, got, atol, rtol, i)
            if not cmp.passed:
                reasons.append(f"timer-escape: the output of timed call {record['call']} is not the reference's on "
                               f"the same inputs (a sample of {got.numel()} elements): the call did not do its work "
                               f"while timed; {cmp.reasons[0]}")
        if reasons:
            break
    return {"reasons": reasons}


def steps(st: State, msg: dict) -> dict:
    """The parent-clocked batch's steps without the calls (runner.harness.procs.batch), for the parent to time: the
    inputs are made by the first request of a cross-check (its sizing probe) and kept until its `batch_check`."""
    if not st.steps or st.steps[:2] != (msg["seed"], msg["out_specs"]):
        st.steps = ()  # (freed before the next inputs are made)
        base = make_inputs(st.problem, msg["seed"], shape_set=0, randn=None, device=st.device)
        st.steps = (msg["seed"], msg["out_specs"], batch.Steps(base, msg["out_specs"], msg["seed"], st.device))
    return st.steps[2].run(msg)


def batch_check(st: State, msg: dict) -> dict:
    st.steps = ()
    base = make_inputs(st.problem, msg["seed"], shape_set=0, randn=None, device=st.device)
    return {"reasons": batch.check(st, msg, base, _run_reference, oracle_outputs)}


def _headers_in_compile_cache() -> None:
    """torch.compile's precompiled C++ headers in its cache folder (TORCHINDUCTOR_CACHE_DIR: the one keyed by this
    problem, runner/harness/compile_cache.py) instead of inductor's default under TMPDIR, the judge's own directory.
    Inductor builds the header for each process that loads a C++ kernel, before it looks for the compiled kernel, so
    there every judge built it again (7 s of CPU on a 2-core machine, with every compiled graph already cached). It is
    keyed by the header's preprocessed text, the command line and the compiler, and shared with the judges of the same
    files only, as the compiled graphs are."""
    import torch._inductor.codecache as codecache  # (torch.compile imports it anyway)

    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if folder and hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_DIR = os.path.join(folder, "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")


def baselines(st: State, msg: dict) -> dict:
    inputs = make_inputs(st.problem, msg["seed"], shape_set=0, randn=None, device=st.device)
    timer = timing.Timer(st.device, st.timer_cfg)
    result: dict = {}
    with torch.no_grad():
        try:
            result["eager"] = timer.measure(lambda: st.model(*inputs)).model_dump()
        except BaseException as exc:  # noqa: BLE001 - the forward is the user's code
            raise reference_failure(st, exc) from None
        if msg.get("compile"):
            try:
                _headers_in_compile_cache()
                compiled = torch.compile(st.model)
                compiled(*inputs)
                result["compile"] = timer.measure(lambda: compiled(*inputs)).model_dump()
            except Exception as exc:  # noqa: BLE001 - a compile failure is reported, not fatal
                result["compile_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    return result


def profile(st: State, msg: dict) -> dict:
    """The reference's kernels (CUDA), so that a candidate that merely reruns them can be recognised."""
    if not st.device.startswith("cuda"):
        return {"kernels": []}
    from runner.harness.procs.profile import profile_kernels

    inputs = make_inputs(st.problem, msg["seed"], shape_set=0, randn=None, device=st.device)
    with torch.no_grad():
        try:
            _, kernels, _ = profile_kernels(lambda: st.model(*inputs), Path(os.getcwd()) / "ref_trace.json")
        except BaseException as exc:  # noqa: BLE001 - the forward is the user's code
            raise reference_failure(st, exc) from None
    return {"kernels": [k["name"] for k in kernels]}


def bandwidth(st: State, msg: dict) -> dict:
    """Device copy bandwidth (bytes read + written per second), the roofline's ceiling."""
    n = msg.get("bytes", 1 << 30) // 4
    src = torch.empty(n, dtype=torch.float32, device=st.device).uniform_()
    dst = torch.empty_like(src)
    timer = timing.Timer(st.device, timing.TimerConfig(warmup=3, min_reps=10, max_reps=50, max_seconds=5))
    t = timer.measure(lambda: dst.copy_(src))
    # The fastest sample: the floor is what the memory system can do at best, so no honest kernel lands under it.
    return {"bandwidth_bytes_per_s": 2 * n * 4 / (t.min_ms / 1e3), "median_ms": t.median_ms, "min_ms": t.min_ms}


def _releasing(handler, release: bool = True):
    """Give the caching allocator's free blocks back to the device after each request: the judge's inputs, clones and
    baselines of a 7 GB problem left 50 GB reserved on the H100, and a candidate's process then ran out of memory.
    Not after `steps` (`release` False): the parent times those requests against the candidate's batches, whose
    process keeps its blocks; blocks given back there would be allocated again inside the next timed request, a cost
    of the judge's alone that the parent would take off the candidate's time (its `batch_check` frees them).
    A ProblemError (the user's inputs or forward failed, whichever request ran them) is answered as one: the parent
    reports it as the user's, not as a broken judge."""
    def run(st: State, msg: dict) -> dict:
        try:
            return handler(st, msg)
        except ProblemError as exc:
            return _problem_error(exc)
        finally:
            if release and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
    return run


HANDLERS = {name: _releasing(h, release=name != "steps") for name, h in {
    "init": init, "prepare": prepare, "check": check, "timed_check": timed_check, "baselines": baselines,
    "steps": steps, "batch_check": batch_check,
    "profile": profile,
    "bandwidth": bandwidth}.items()}

if __name__ == "__main__":
    serve(HANDLERS, State())
