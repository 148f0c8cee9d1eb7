"""The reference's side of the harness, as the parent sees it: the judge process (started on first use), what the
problem costs (baselines, roofline, the reference's own kernels) and what its trials showed (output specs, the
fingerprints degeneracy is judged by, notes on the tolerance used)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from runner.contract import Baselines, Environment, ProblemSpec, Roofline, Timing
from runner.errors import MachineError, ProblemError
from runner.harness import compile_cache
from runner.harness.baseline_cache import baseline_key, cached_baselines
from runner.harness.config import HarnessConfig, child_env, timing_cores
from runner.harness.plan import Seeds
from runner.harness.procs.process import Child, ChildDied, Limits
from runner.version import fusebot_version

log = logging.getLogger(__name__)


class Reference:
    def __init__(self, problem: ProblemSpec, device: str, config: HarnessConfig, seeds: Seeds, workdir: Path,
                 cache_dir: Path):
        self.problem, self.device, self.config, self.seeds = problem, device, config, seeds
        self.workdir, self.cache_dir = workdir, cache_dir
        self._child: Child | None = None
        self.info: dict = {}
        self._baselines: Baselines | None = None
        self._roofline: Roofline | None = None
        self._kernels: list[str] | None = None
        self.out_specs: dict[int, tuple[list, str]] = {}  # shape set -> the reference's output specs, structure
        # per trial of every passed verification: the reference output's fingerprint, near-constant (within the atol
        # its check uses), [min, max] over its values, and that atol
        self.digests: list[tuple[str, bool, list | None, float]] = []
        self.tolerance_notes: set[str] = set()  # how the judge chose a tolerance where it is not the default one

    @property
    def where(self) -> str:
        return self.problem.path or self.problem.module or self.problem.name

    def start(self) -> Child:
        """The judge process, started and initialised once."""
        if self._child is None:
            wd = self.workdir / "judge"
            wd.mkdir(parents=True, exist_ok=True)
            env = compile_cache.judge_env(child_env(wd, self.cache_dir), self.cache_dir, self.problem, self.device)
            self._child = Child("runner.harness.procs.judge", wd, env, Limits(self.config.memory_bytes))
            shared = env["TORCHINDUCTOR_CACHE_DIR"]
            self.info = self.ask({"cmd": "init", "problem": self.problem.model_dump(), "device": self.device,
                                  "init_seed": self.seeds.seed("init"), "timer": self.config.timer,
                                  "extra_write": [] if Path(shared).is_relative_to(wd) else [shared],
                                  "cores": timing_cores(self.config) if self.device == "cpu" else None},
                                 self.config.init_timeout_s, "init")
        return self._child

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

    def ask(self, msg: dict, timeout_s: float, stage: str) -> dict:
        """One request to the judge. The reference's own failures raise ProblemError; a judge that dies or fails
        otherwise raises MachineError (callers for whom a candidate may be the cause catch it first)."""
        child = self._child if self._child is not None else self.start()
        try:
            reply = child.request(msg, timeout_s)
        except ChildDied as exc:
            self.close()
            if exc.kind == "timeout":
                raise ProblemError(stage, self.where, f"your module did not finish within {timeout_s:.0f} s") from None
            raise MachineError(f"the reference process died during {stage}: {exc}\n{exc.log_tail}") from None
        if not reply.get("ok", False):
            pe = reply.get("problem_error")
            if pe:
                raise ProblemError(pe["stage"], pe["where"], pe["cause"])
            raise MachineError(f"judge failed during {stage}: {reply.get('error')}\n{reply.get('traceback', '')}")
        return reply

    # ---- what the problem costs ---------------------------------------------------------------------------------

    def source(self) -> str:
        self.start()
        return self.info["source"]

    def environment(self, confinement: dict | None = None) -> Environment:
        self.start()
        # the version the parent runs (the judge's sandbox may not see the package's metadata or the checkout's .git)
        return Environment(**{**self.info["environment"], "fusebot": fusebot_version()},
                           sandbox=confinement or self.info.get("confinement", {}))

    def measure_baselines(self, label: str) -> Baselines:
        """Eager (and torch.compile) timed once more on inputs drawn from the seed of `label`."""
        reply = self.ask({"cmd": "baselines", "seed": self.seeds.seed(label), "compile": self.config.compile_baseline},
                         self.config.time_timeout_s + 600, "baselines")
        return Baselines(eager=Timing(**reply["eager"]),
                         compile=Timing(**reply["compile"]) if reply.get("compile") else None,
                         compile_error=reply.get("compile_error"))

    def baselines(self) -> Baselines:
        """Measured once per problem, device, torch version and inputs (runner.harness.baseline_cache)."""
        if self._baselines is None:
            self.start()
            self._baselines = cached_baselines(self.cache_dir, baseline_key(self.problem, self.info, self.config),
                                               lambda: self.measure_baselines("baselines"))
        return self._baselines

    def bandwidth(self) -> tuple[float, str]:
        """The memory system's ceiling in bytes per second (measured once per device and cached), and its source."""
        if self.config.bandwidth_bytes_per_s:
            return self.config.bandwidth_bytes_per_s, "given in the harness configuration"
        env = self.environment()
        gpu = env.gpu or env.cpu or "cpu"
        path = self.cache_dir / "bandwidth.json"
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        if gpu not in known:
            nbytes = (4 << 30) if self.device == "cuda" else (256 << 20)  # large: the sync and flush amortised
            reply = self.ask({"cmd": "bandwidth", "bytes": nbytes}, 300, "bandwidth")
            known[gpu] = reply["bandwidth_bytes_per_s"]
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bandwidth-")
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(known, indent=1))
            os.replace(tmp, path)  # whole or not at all: searches on one machine share the cache
        return known[gpu], f"device copy measured on {gpu}"

    def roofline(self) -> Roofline | None:
        if self._roofline is None:
            reply = self.ask({"cmd": "prepare", "trial": -1, "seed": self.seeds.seed("roofline"), "shape_set": 0,
                              "randn": None}, self.config.trial_timeout_s, "roofline")
            moved = reply["input_bytes"] + reply["output_bytes"] + self.info.get("param_bytes", 0)
            bw, source = self.bandwidth()
            self._roofline = Roofline(bytes_moved=moved, bandwidth_bytes_per_s=bw, bandwidth_source=source,
                                      floor_ms=moved / bw * 1e3)
        return self._roofline

    def known_roofline(self) -> Roofline | None:
        """The roofline if it was measured already (a plan does not measure it just to choose its trials)."""
        return self._roofline

    def kernels(self) -> list[str]:
        """The GPU kernels one reference call launches (none on the CPU)."""
        if self._kernels is None:
            reply = self.ask({"cmd": "profile", "seed": self.seeds.seed("profile")}, 300, "profile")
            self._kernels = reply["kernels"]
        return self._kernels

    # ---- trials ------------------------------------------------------------------------------------------------

    def prepare(self, trial: dict) -> dict:
        """The reference's outputs for one trial, kept in the judge; its specs and fingerprint come back."""
        prep = self.ask({"cmd": "prepare", **trial}, self.config.trial_timeout_s, "reference")
        self.out_specs.setdefault(trial["shape_set"], (prep["outputs"], prep["structure"]))
        self.tolerance_notes.update(prep.get("tolerance_notes", []))
        return prep
