"""Candidates' processes, as the parent sees them: one fresh process per candidate (and per re-measure), started
with its load request in flight so that several load at once, or taken from the spares started and warmed up before
their candidates were known; every request to one enforces the memory caps of the others that are alive."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from runner.contract import Candidate, ProblemSpec
from runner.errors import MachineError
from runner.harness.config import HarnessConfig, child_env, timing_cores
from runner.harness.plan import Seeds
from runner.harness.procs.process import Child, ChildDied, Limits

log = logging.getLogger(__name__)


def died_label(exc: ChildDied) -> str:
    """The reason name of a process that died: timeout, memory or crash."""
    return {"timeout": "timeout", "memory": "memory", "crash": "crash"}.get(exc.kind, "crash")


def tail(text: str, n: int = 600) -> str:
    text = text.strip()
    return f"\n--- last output ---\n{text[-n:]}" if text else ""


def discard_outputs(workdir: Path, reply: dict) -> None:
    """Delete a trial's output files once the judge has read them: they live in /dev/shm (memory), and five trials
    of a 6 GB output per candidate, several candidates loaded at once, filled the host's memory on the H100."""
    root = Path(workdir).resolve()
    for meta in [*(reply.get("outputs") or []), *(reply.get("second_run") or [])]:
        f = meta.get("file") if isinstance(meta, dict) else None
        if f and Path(f).resolve().is_relative_to(root):
            Path(f).resolve().unlink(missing_ok=True)


def log_load(child: Child, phases: dict) -> None:
    """Where a candidate's load went (DEBUG): the process's start and imports, then each step of its `init`."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    spawned, imported = child.started_at, phases.pop("imported_at", None)
    steps = {"start and imports": imported - spawned} if isinstance(imported, float) and spawned else {}
    steps |= {k.removesuffix("_s").replace("_", "-"): v for k, v in phases.items() if isinstance(v, float)}
    log.debug("%s loaded in %.2f s: %s", child.workdir.name, time.time() - spawned if spawned else 0.0,
              ", ".join(f"{k} {v:.2f}" for k, v in steps.items()))


class Contestants:
    def __init__(self, problem: ProblemSpec, device: str, config: HarnessConfig, seeds: Seeds, workdir: Path,
                 cache_dir: Path):
        self.problem, self.device, self.config, self.seeds = problem, device, config, seeds
        self.workdir, self.cache_dir = workdir, cache_dir
        self.siblings: tuple[Child, ...] = ()  # other live candidates' processes while one is verified or timed
        self._spares: list[list] = []  # [process, warmed] started before their candidates (`prestart`)

    def _settings(self) -> dict:
        return {"problem": self.problem.model_dump(), "device": self.device, "timer": self.config.timer,
                "address_space_bytes": self.config.cpu_address_space_bytes if self.device == "cpu" else None,
                "cores": timing_cores(self.config) if self.device == "cpu" else None}

    def prestart(self, n: int) -> None:
        """Start processes until `n` spares are warming or warm: each is confined and warms its device and runtime up
        now, before its candidate is known, and a fast-format candidate's `spawn` then only has to load its library
        (on the H200, the process start, imports and warm-up were 8-10 s of an 11 s load). Without waiting."""
        while len(self._spares) < n:
            wd = self.workdir / f"spare-{self.seeds.next_number()}"
            # the build cache read-only: the library of the candidate it will take is not built yet
            child = Child("runner.harness.procs.contestant", wd, child_env(wd, self.cache_dir),
                            Limits(self.config.memory_bytes), read=[self._builds()])
            try:
                child.send({"cmd": "warm", **self._settings()})
            except ChildDied:
                child.close()
                return
            self._spares.append([child, False])

    def settle(self) -> None:
        """Wait until every spare has finished warming up (or is dropped): measurements follow, and no process start,
        import or warm-up may overlap one."""
        for spare in list(self._spares):
            if not spare[1]:
                self._take_reply(spare)

    def _take_reply(self, spare: list) -> bool:
        child = spare[0]
        try:
            reply = child.receive("warm", self.config.init_timeout_s)
        except ChildDied as exc:
            log.warning("a spare process died while warming up: %s", exc)
            reply = {"ok": False}
        spare[1] = bool(reply.get("ok"))
        if not spare[1]:
            child.close()
            self._spares.remove(spare)
        return spare[1]

    def _spare(self) -> Child | None:
        while self._spares:
            spare = self._spares[0]
            if spare[1] or self._take_reply(spare):
                self._spares.remove(spare)
                return spare[0]
        return None

    def _builds(self) -> Path:
        """The build cache, which spares read (and which exists before they start)."""
        path = (self.cache_dir / "build").resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def close(self) -> None:
        """Stop the spares."""
        for child, _ in self._spares:
            child.close()
        self._spares = []

    def spawn(self, candidate: Candidate, library: Path | None, tag: str) -> Child:
        """Start a candidate's process (or take a warm spare) and send its load request without waiting for the
        answer."""
        child = self._spare() if candidate.format == "fast" else None
        if child is not None and (library is None or library.resolve().is_relative_to(self._builds())):
            msg = {"cmd": "init", **self._settings(), "candidate": candidate.model_dump(),
                   "library": str(library) if library else None, "init_seed": self.seeds.seed("init"),
                   "extra_write": []}
            try:
                child.send(msg)
            except ChildDied:
                pass  # reported by await_load
            return child
        if child is not None:  # a library from elsewhere, which the spare cannot read: it goes back
            self._spares.insert(0, [child, True])
        safe_id = "".join(c if c.isalnum() or c in "-_" else "_" for c in candidate.id)[:60]
        wd = self.workdir / f"cand-{safe_id}-{tag}-{self.seeds.next_number()}"
        wd.mkdir(parents=True, exist_ok=True)
        extra = []
        if candidate.format == "kernelbench":
            (wd / "candidate.py").write_text(next(iter(candidate.sources.values())))
            digest = hashlib.sha256(json.dumps(candidate.sources, sort_keys=True).encode()).hexdigest()[:24]
            ext = self.cache_dir / "kernelbench" / digest
            ext.mkdir(parents=True, exist_ok=True)
            extra.append(str(ext))
        env = child_env(wd, self.cache_dir)
        if extra:
            env["TORCH_EXTENSIONS_DIR"] = extra[0]
        child = Child("runner.harness.procs.contestant", wd, env, Limits(self.config.memory_bytes))
        msg = {"cmd": "init", **self._settings(), "candidate": candidate.model_dump(),
               "library": str(library) if library else None, "init_seed": self.seeds.seed("init"),
               "extra_write": extra}
        try:
            child.send(msg)
        except ChildDied:
            pass  # reported by await_load
        return child

    def await_load(self, child: Child, siblings: tuple[Child, ...] = ()) -> tuple[Child | None, list[str], dict]:
        """(the loaded process or None, the reasons it was refused, its confinement)."""
        try:
            reply = child.receive("init", self.config.init_timeout_s, siblings)
        except ChildDied as exc:
            child.close()
            return None, [f"{died_label(exc)} while loading: {exc}{tail(exc.log_tail)}"], {}
        if not reply.get("ok"):
            child.close()
            return None, [self.fault("loading", reply)], {}
        log_load(child, reply.get("phases") or {})
        return child, list(reply.get("reasons", [])), reply.get("confinement", {})

    def start(self, candidate: Candidate, library: Path | None, tag: str) -> tuple[Child | None, list[str], dict]:
        return self.await_load(self.spawn(candidate, library, tag))

    def probe(self, failure: str) -> None:
        """Run a known-good computation in a fresh process; raise MachineError if it fails too (the machine is
        broken, not the candidate that met `failure`)."""
        wd = self.workdir / f"probe-{self.seeds.next_number()}"
        child = Child("runner.harness.procs.probe", wd, child_env(wd, self.cache_dir),
                        Limits(self.config.memory_bytes))
        try:
            reply = child.request({"cmd": "probe", "device": self.device}, self.config.trial_timeout_s)
        except ChildDied as exc:
            raise MachineError(f"{failure}; and a known-good probe died too: {exc}\n{exc.log_tail}") from None
        finally:
            child.close()
        if not reply.get("ok"):
            raise MachineError(f"{failure}; and a known-good probe failed too: {reply.get('error')}")

    def fault(self, stage: str, reply: dict) -> str:
        """The crash reason for a candidate's process that failed outside the candidate's call (an error escaped
        the harness's own code there: the candidate exited, ran out of file descriptors, left a sticky CUDA error),
        after a probe has shown that the machine works."""
        error = str(reply.get("error") or "no reply")
        self.probe(f"a candidate's process failed during {stage}: {error}")
        return f"crash: the candidate's process failed during {stage}: {error[-1500:]}"

    def ask(self, child: Child, msg: dict, timeout_s: float) -> dict:
        """A request to a candidate's process; other live candidates' memory caps are enforced while it runs."""
        child.send(msg)
        return child.receive(msg.get("cmd", "?"), timeout_s, self.siblings)
