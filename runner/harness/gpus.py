"""Every GPU of a host in one process: one confined evaluator per device, all of them fed from the search's queue.

    with device_evaluators(spec, "cuda", devices=[0, 1]) as ev:   # an EvaluatorLike over both GPUs
        verdicts = ev.evaluate_many(candidates)                    # shared among the GPUs, in the order given

`DeviceEvaluator` is the harness's Evaluator in a process of its own whose CUDA_VISIBLE_DEVICES names one GPU: its
judge and every candidate's process inherit that environment, so they see that GPU alone, and a candidate's baselines
(eager and torch.compile, measured by that evaluator's judge) come from the same GPU as the candidate. `DeviceSet`
puts several evaluators together: each takes the next few candidates of a chunk as it frees up, and each verdict names
the device it was measured on (`verdict.environment.device`, e.g. "cuda:1"). The problem's own measurements (its
source, baselines, roofline, environment) and the confirmation of the winner come from the set's first device.

On the CPU backend the devices are slices of the host's cores (tests use N CPU "devices"); a single device, or none,
is the plain in-process Evaluator, as before.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Any

from runner.contract import Candidate, ProblemSpec, Verdict
from runner.errors import MachineError, ProblemError, UsageError
from runner.harness.config import HarnessConfig
from runner.harness.confirm import CONFIRM_ROUNDS
from runner.harness.evaluator import Evaluator

log = logging.getLogger(__name__)


# ---- which GPUs ---------------------------------------------------------------------------------------------------

def visible_gpus() -> int:
    """How many CUDA devices this process sees (0 without CUDA)."""
    try:
        import torch  # only where GPUs are counted: the bot imports this module's callers without torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def parse_gpus(text: str | Sequence[int] | None, count: int) -> list[int]:
    """`--gpus` (or FUSEBOT_GPUS): None, "" or "all" is every visible device; "0,1" (or [0, 1]) those devices. A
    device that is not visible, or named twice, is a usage error that says which are."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "all")):
        return list(range(count))
    try:
        wanted = [int(x) for x in text.split(",")] if isinstance(text, str) else [int(x) for x in text]
    except ValueError:
        raise UsageError(f"--gpus takes device indices like 0,1 (or all), not {text!r}") from None
    if len(set(wanted)) != len(wanted):
        raise UsageError(f"--gpus names a device twice: {text!r}")
    bad = [d for d in wanted if not 0 <= d < count]
    if bad or not wanted:
        raise UsageError(f"--gpus {text!r}: this host has {count} visible GPU(s) (0..{count - 1})")
    return wanted


def physical_device(index: int, environ: Mapping[str, str] | None = None) -> str:
    """What CUDA_VISIBLE_DEVICES must say for a child to see this process's device `index` (this process may itself
    see a subset: CUDA_VISIBLE_DEVICES=2,3 makes its device 0 the host's device 2)."""
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return str(index)
    names = [x.strip() for x in visible.split(",") if x.strip()]
    return names[index] if index < len(names) else str(index)


def lanes(devices: Sequence[int], targets: int) -> list[list[int]]:
    """Devices shared among searches running at once: a search per device while targets outnumber devices; otherwise
    each target's search gets an equal share of the devices (2 GPUs, 1 target: one search over both)."""
    n = max(1, min(len(devices), targets))
    return [list(devices[k::n]) for k in range(n)] if devices else [[]]


# ---- one device: an evaluator in its own process ------------------------------------------------------------------

_EVALUATOR: Evaluator | None = None


def _start(device_env: str | None, problem: ProblemSpec, backend: str, config: HarnessConfig) -> None:
    global _EVALUATOR
    if device_env is not None:  # before this process first uses CUDA (torch reads it then)
        os.environ["CUDA_VISIBLE_DEVICES"] = device_env
    _EVALUATOR = Evaluator(problem, backend=backend, config=config)


def _call(name: str, *args: Any) -> tuple:
    """Run one Evaluator method; typed errors come back as data (ProblemError does not survive pickling)."""
    assert _EVALUATOR is not None
    try:
        return ("ok", getattr(_EVALUATOR, name)(*args))
    except ProblemError as e:
        return ("problem", e.stage, e.where, e.cause)
    except UsageError as e:
        return ("usage", str(e))
    except Exception as e:  # a broken machine, whatever its type, is one here
        return ("machine", f"{type(e).__name__}: {e}")


class DeviceEvaluator:
    """The harness's Evaluator confined to one device, in a process of its own (see the module's docstring)."""

    def __init__(self, problem: ProblemSpec, device: int, *, backend: str = "cuda", label: str | None = None,
                 config: HarnessConfig | None = None) -> None:
        self.device, self.backend = device, backend
        self.label = label or f"{backend}:{device}"
        env = physical_device(device) if backend == "cuda" else None
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                                         initargs=(env, problem, backend, config or HarnessConfig()))
        self._closed = False

    def _run(self, name: str, *args: Any) -> Any:
        try:
            out = self._pool.submit(_call, name, *args).result()
        except BrokenProcessPool as e:
            raise MachineError(f"the evaluator process of {self.label} died: {e}") from None
        if out[0] == "ok":
            return out[1]
        if out[0] == "problem":
            raise ProblemError(*out[1:])
        if out[0] == "usage":
            raise UsageError(out[1])
        raise MachineError(f"{self.label}: {out[1]}")

    def evaluate_many(self, candidates: list[Candidate]) -> list[Verdict]:
        return [name_device(v, self.label) for v in self._run("evaluate_many", candidates)]

    def evaluate(self, candidate: Candidate) -> Verdict:
        return name_device(self._run("evaluate", candidate), self.label)

    def confirm(self, candidate: Candidate, rounds: int = CONFIRM_ROUNDS, on_round: Callable | None = None) -> Verdict:
        """The rounds run in the device's process: `on_round` hears of them when they are all done."""
        v = name_device(self._run("confirm", candidate, rounds), self.label)
        c = v.confirmation
        for n, cand_ms in enumerate(c.candidate_ms if c and on_round else [], 1):
            on_round(n, cand_ms, c.eager_ms[n - 1], c.compile_ms[n - 1] if n <= len(c.compile_ms) else None)
        return v

    def reference_source(self) -> str:
        return self._run("reference_source")

    def baselines(self):
        return self._run("baselines")

    def roofline(self):
        return self._run("roofline")

    def environment(self, confinement: dict | None = None):
        return self._run("environment", confinement)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run("close")
        except MachineError as e:
            log.warning("%s did not close cleanly: %s", self.label, e)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> DeviceEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def name_device(verdict: Verdict, label: str) -> Verdict:
    """The verdict, naming the device it was measured on."""
    if verdict.environment is not None and verdict.environment.device != label:
        verdict = verdict.model_copy(update={"environment": verdict.environment.model_copy(update={"device": label})})
    return verdict


# ---- several devices as one evaluator -----------------------------------------------------------------------------

class DeviceSet:
    """Evaluators of one problem, one per device, as one EvaluatorLike (see the module's docstring)."""

    def __init__(self, evaluators: Mapping[str, Any]) -> None:
        if not evaluators:
            raise ValueError("a DeviceSet needs at least one evaluator")
        self.evaluators = dict(evaluators)
        self.first = next(iter(self.evaluators.values()))
        self.lanes = len(self.evaluators)  # the search keeps its chunks at least this large
        self._threads = ThreadPoolExecutor(self.lanes, thread_name_prefix="device")

    def evaluate_many(self, candidates: list[Candidate]) -> list[Verdict]:
        """Every candidate once, on whichever device is free: each device takes the next few from one queue (about
        half its share at a time, so a device that finishes early takes more). Verdicts in the order given."""
        queue = deque(enumerate(candidates))
        take = max(1, math.ceil(len(candidates) / (2 * self.lanes)))
        lock = threading.Lock()
        out: list[Verdict | None] = [None] * len(candidates)

        def lane(label: str, ev: Any) -> None:
            while True:
                with lock:
                    batch = [queue.popleft() for _ in range(min(take, len(queue)))]
                if not batch:
                    return
                for (i, _), v in zip(batch, ev.evaluate_many([c for _, c in batch]), strict=True):
                    out[i] = name_device(v, label)

        futures = [self._threads.submit(lane, label, ev) for label, ev in self.evaluators.items()]
        errors = [f.exception() for f in futures]
        for e in errors:
            if e is not None:
                raise e
        assert all(v is not None for v in out)
        return out  # type: ignore[return-value]

    def evaluate(self, candidate: Candidate) -> Verdict:
        return self.evaluate_many([candidate])[0]

    def confirm(self, candidate: Candidate, rounds: int = CONFIRM_ROUNDS, on_round: Callable | None = None) -> Verdict:
        return self.first.confirm(candidate, rounds=rounds, on_round=on_round)

    def abort(self) -> None:
        """Cut off the evaluation in flight on every device whose evaluator can be (an in-process one)."""
        for ev in self.evaluators.values():
            if hasattr(ev, "abort"):
                ev.abort()

    def reference_source(self) -> str:
        return self.first.reference_source()

    def baselines(self):
        return self.first.baselines()

    def roofline(self):
        return self.first.roofline()

    def environment(self, confinement: dict | None = None):
        return self.first.environment(confinement)

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        for ev in self.evaluators.values():
            if hasattr(ev, "close"):
                ev.close()


def core_slices(n: int) -> list[list[int]]:
    """This process's cores in `n` disjoint slices (CPU "devices": each times candidates on its own cores)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < n:
        raise UsageError(f"{n} CPU devices need {n} cores; this process has {len(cores)}")
    return [cores[k::n] for k in range(n)]


@contextlib.contextmanager
def device_evaluators(problem: ProblemSpec, backend: str, devices: Sequence[int], config: HarnessConfig | None = None,
                      *, total: int | None = None, visible: int | None = None) -> Iterator[Any]:
    """The evaluator for one search over `devices` (of `total` in use at once; `visible`: the GPUs this process sees).
    CUDA: the plain in-process Evaluator where this process sees one GPU at most (a worker pinned to its GPU), else a
    DeviceEvaluator per device, each seeing its GPU alone. CPU: device k is the k-th slice of the cores; one device is
    the in-process Evaluator on its slice, several a DeviceSet of DeviceEvaluators."""
    config = config or HarnessConfig()
    total = max(total or len(devices), 1)
    slices = core_slices(total) if backend != "cuda" and total > 1 else None

    def cfg(d: int) -> HarnessConfig:
        return replace(config, cpu_cores=slices[d]) if slices is not None else config

    seen = (visible_gpus() if visible is None else visible) if backend == "cuda" else 0
    if (backend == "cuda" and (seen <= 1 or not devices)) or (backend != "cuda" and len(devices) <= 1):
        with Evaluator(problem, backend=backend, config=cfg(devices[0]) if devices else config) as ev:
            yield ev
        return
    started: dict[str, DeviceEvaluator] = {}
    try:
        for d in devices:
            ev = DeviceEvaluator(problem, d, backend=backend, config=cfg(d))
            started[ev.label] = ev
        ds = DeviceSet(started)
        try:
            yield ds
        finally:
            ds.close()
    finally:
        for ev in started.values():
            ev.close()
