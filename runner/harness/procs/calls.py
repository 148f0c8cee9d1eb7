"""How the candidate's process calls the candidate, the same way whether it verifies or times it.

Every call, verified or timed, goes through the shared timer (`runner.harness.timing.Timer.measure`: the same
frames on the stack, the same flush before it), through the same callable (the drop-in where there is one), with the
same global flags, after the same `before` step: the caching allocator is left full of NaN-filled blocks of each
output's size, so an output the candidate does not write shows. Timed calls get fresh inputs (each call its own
scale of the trial's inputs, so nothing can be replayed from a cache keyed on content), and a random sample of each
timed call's outputs, at positions drawn after the call returned, is kept for the judge to check.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
from pathlib import Path

import torch

from runner.harness import timing, verify

_empty = torch.empty
_sync = torch.cuda.synchronize

SAMPLED_ELEMENTS = 1024  # per output of each timed call
CHECKED_CALLS = 3  # timed calls whose samples the judge checks


def poison_fill(t: torch.Tensor) -> None:
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(-0x5A5A5A5A if t.element_size() >= 4 else -0x5A)


def poison_allocator(specs: list[dict], device: str) -> None:
    """Leave NaN-filled blocks of each output's size in the allocator's cache, so that an output the candidate
    allocates but does not write (or memory it reads before writing) holds NaN rather than plausible numbers."""
    # On the CPU, malloc may carve a smaller allocation out of a freed block first (a candidate's scratch before its
    # output): several blocks a size, coalesced when freed, leave poisoned memory for both.
    copies = 1 if device.startswith("cuda") else 4
    blocks = [_empty(s["shape"], dtype=verify.DTYPE_NAMES[s["dtype"]], device=device) for s in specs
              for _ in range(copies)]
    for b in blocks:
        poison_fill(b)
    if device.startswith("cuda"):
        _sync()
    del blocks


class Capture:
    """The callable every verified and timed call goes through: it keeps what the last call returned."""

    def __init__(self, fn):
        self.fn = fn
        self.out = None

    def __call__(self) -> None:
        self.out = self.fn()


def call_once(device: str, capture: Capture, before) -> object:
    """One call, as a timed call is made (through the timer, behind its flush), its result returned."""
    timer = timing.Timer(device, timing.TimerConfig(warmup=0, min_reps=1, max_reps=1, check_every=1))
    timer.measure(capture, before=before)
    return capture.out


def call_scale(seed: int, k: int) -> float:
    """The scale of timed call k's inputs: in [0.75, 1.25), never 1 twice, known to the judge from the seed."""
    return 0.75 + 0.5 * (((seed * 0x9E3779B1 + k * 0x85EBCA77) >> 7) % 100003) / 100003


class FreshInputs:
    """Each timed call's inputs: the trial's inputs with every floating tensor scaled by the call's own factor,
    written into the same buffers (outside the timed region)."""

    def __init__(self, base: list, seed: int):
        self.base, self.seed, self.k = base, seed, -1
        self.work = [x.clone() if isinstance(x, torch.Tensor) else x for x in base]

    def scale(self, k: int) -> float:
        return call_scale(self.seed, k)

    def next(self) -> None:
        self.k += 1
        s = self.scale(self.k)
        for b, w in zip(self.base, self.work, strict=True):
            if isinstance(b, torch.Tensor):
                if b.is_floating_point():
                    torch.mul(b, s, out=w)
                else:
                    w.copy_(b)


class Samples:
    """After each timed call: SAMPLED_ELEMENTS evenly spaced elements of each output, from an offset drawn after
    the call returned (so no call can know which of its elements will be looked at)."""

    def __init__(self, capture: Capture, inputs: FreshInputs):
        self.capture, self.inputs = capture, inputs
        self.kept: list[dict] = []

    def take(self) -> None:
        flat, _ = verify.flatten(self.capture.out)
        record = {"call": self.inputs.k, "scale": self.inputs.scale(self.inputs.k), "outputs": []}
        for t in flat:
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                record["outputs"].append(None)
                continue
            n = t.numel()
            step = max(1, n // SAMPLED_ELEMENTS)
            offset = secrets.randbelow(step)
            record["outputs"].append({"step": step, "offset": offset,
                                      "values": t.detach().reshape(-1)[offset::step][:SAMPLED_ELEMENTS].clone()})
        self.kept.append(record)

    def chosen(self) -> list[dict]:
        """CHECKED_CALLS of the kept calls, chosen now that every call has returned: the last, and others at
        random."""
        if not self.kept:
            return []
        rest = list(range(len(self.kept) - 1))
        picks = [len(self.kept) - 1]
        while rest and len(picks) < CHECKED_CALLS:
            picks.append(rest.pop(secrets.randbelow(len(rest))))
        return [self.kept[i] for i in sorted(picks)]


def own_modules(dirs: list[Path]) -> set[str]:
    """The names of the candidate's own compiled modules: shared objects loaded in this process (mapped, not merely
    present) from its own directories, less any name a module from elsewhere or a standard one already has (an
    empty `sys.so` in its directory is no module of its own)."""
    mapped = set()
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and ".so" in parts[5]:
                mapped.add(Path(parts[5].strip()))
    own = {p.name.split(".")[0] for p in mapped if any(p.is_relative_to(d) for d in dirs)}
    taken = set(sys.builtin_module_names) | set(sys.stdlib_module_names)
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if not file or not any(Path(file).resolve().is_relative_to(d) for d in dirs):
            taken.add(name.split(".")[0])
    return own - taken


def own_code_ran(dirs: list[Path], run) -> tuple[object, bool]:
    """CPU: did a C function from one of the candidate's own compiled extensions run during the call?

    load_inline does not register its module in sys.modules, so the candidate's modules are known by the shared
    objects loaded from its own directories; a pybind function's __module__ names the module it belongs to."""
    own = own_modules(dirs)
    seen: set[str] = set()

    def prof(frame, event, arg):
        if event == "c_call":
            mod = getattr(arg, "__module__", None)
            if isinstance(mod, str):
                seen.add(mod.split(".")[0])

    sys.setprofile(prof)
    try:
        out = run()
    finally:
        sys.setprofile(None)
    return out, bool(own & seen)
