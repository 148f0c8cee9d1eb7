"""The contract between bot, runner and harness: plain pydantic models, importable without torch.

Everything a search, a worker or the bot exchanges is one of these. Times are milliseconds (`_ms`), sizes bytes
(`bytes_`), rates bytes per second; stored numbers are never rounded.
"""

from __future__ import annotations

import re
from enum import IntEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer

SCHEMA_VERSION = 1

DType = Literal["float32", "float16", "bfloat16", "float64"]
Backend = Literal["cuda", "cpu"]
# What a job does: `search` finds kernels for marked modules; `benchmark` re-verifies and re-times the kernels as they
# are in the job's commit (a fusebot PR's branch, a maintainer's edits included); `hygiene` does the same for the
# kernels merged on the default branch, so that the stale ones can be removed. Neither of the last two searches.
JobKind = Literal["search", "benchmark", "hygiene"]

# Next to each kernel fusebot writes (`<kernels_dir>/<folder>/fusebot.json`): what re-verifying it needs. The bot finds
# kernels by it, the runner re-verifies from it (runner/results/files.py writes it, runner/results/remeasure.py reads it).
MANIFEST_FILE = "fusebot.json"


class ExitStatus(IntEnum):
    """Every fusebot command's exit status, one table (EXIT_STATUS; docs/exit-status.md repeats it): the CLI's
    commands, the worker and the Action exit by it. A ProblemError or UsageError (runner/errors.py) is USAGE, a
    MachineError is MACHINE."""

    OK = 0
    REJECTED = 1
    USAGE = 2
    MACHINE = 3
    INTERRUPTED = 130


EXIT_STATUS: dict[int, str] = {
    ExitStatus.OK: "done: the outcome is on stdout (eval: the candidate is correct; optimize, bench: the search ran, "
                   "improved or not)",
    ExitStatus.REJECTED: "eval: the candidate was rejected (each failed check is named)",
    ExitStatus.USAGE: "your mistake: a usage or configuration error, or a broken problem (the message names your "
                      "file and line)",
    ExitStatus.MACHINE: "a broken machine: no GPU, no compiler, no sandbox, a harness process that died, GitHub "
                        "or the bot unreachable",
    ExitStatus.INTERRUPTED: "interrupted (Ctrl-C): `fusebot optimize` resumes from its trace",
}

# Default tolerances per dtype (atol, rtol), overridable per problem.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "float64": (1e-6, 1e-6),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}


# Every reason in a Verdict starts with one of these names and a colon (documented in docs/eval.md).
REASON_NAMES = (
    "build", "load", "runtime", "crash", "timeout", "memory", "mismatch", "uninitialized-output", "nan-mismatch",
    "inf-mismatch", "shape", "dtype", "device", "layout", "output-type", "nondeterministic", "stale-result",
    "second-shape", "input-mutation", "monkeypatch", "global-state", "background-thread", "side-stream", "no-kernel",
    "fallback", "timer-escape", "below-floor", "backend", "drop-in", "unstable-measurement",
)

# The reason of a candidate whose evaluation was cut off (the budget ran out, or the job was cancelled): its verdict
# is not the candidate's, and is never archived (a resumed search evaluates it again).
CUT_OFF = "cut off: the evaluation was aborted (the budget ran out, or the job was cancelled)"


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def inert(text: str) -> str:
    """`text` with every C0 and C1 control character but newline and tab removed (ESC and CSI sequences, carriage
    return, backspace): text a candidate wrote can reach a terminal, a verdict, a check run or a PR, and there it
    must not move the cursor, erase a line or print over fusebot's own words."""
    return _CONTROL.sub("", text)


# a string a candidate may have written: made inert when a model is read and when it is written
InertStr = Annotated[str, AfterValidator(inert), PlainSerializer(inert, return_type=str)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProblemSpec(_Model):
    """What to optimise: a KernelBench-format file, or a module found in a repository.

    A KernelBench file defines `Model`, `get_inputs()` and `get_init_inputs()`; `path` names it and the rest keep their
    defaults. A repository module is named by `module` (import path, resolved under `root`) and `class_name`; inputs
    come from `inputs` (a `module:function` factory, or a function name in the same module).
    """

    name: str
    path: str | None = None
    root: str | None = None
    module: str | None = None
    class_name: str = "Model"
    inputs: str = "get_inputs"
    init_inputs: str | None = "get_init_inputs"
    init_args: list = Field(default_factory=list)
    init_kwargs: dict = Field(default_factory=dict)
    second_inputs: str | None = None
    input_shapes: list[list[int]] | None = None  # instead of `inputs`: random tensors of these shapes and `dtype`
    dtype: DType | None = None
    atol: float | None = None
    rtol: float | None = None
    randn_trials: bool = True  # also draw floating inputs from scaled randn, beside the factory's own distribution


class Candidate(_Model):
    """A kernel to evaluate.

    `kernelbench`: `sources` holds one Python file defining `ModelNew` (any published KernelBench kernel).
    `fast`: `sources` holds CUDA-C (`.cu`) or C++ (`.cpp`) exporting the C ABI of runner/csrc/fusebot.h:
    `int fusebot_forward(const fb_tensor* in, int n_in, fb_tensor* out, int n_out, void* stream)`, where `in` is the
    forward's arguments followed by the module's parameters and buffers in state_dict order, and `out` is allocated by
    the harness (contiguous, the reference's shapes and dtypes).
    """

    id: str
    format: Literal["kernelbench", "fast"]
    backend: Backend = "cuda"
    sources: dict[str, str]
    extra_cflags: list[str] = Field(default_factory=list)
    idea: str = ""  # the plain-language idea this implements
    parent: str | None = None  # the candidate this one repairs or refines
    # a source rewrite (runner/proposers/rewrite/): the user's module file's full new text, to be shown as a diff
    # against the file in the PR; "" for a kernel
    rewrite: str = ""
    # what a rewrite needs that no guard in its code tests (values: no inf or NaN), stated in its PR and its test
    preconditions: list[str] = Field(default_factory=list)


class Timing(_Model):
    median_ms: float
    iqr_ms: float
    mean_ms: float
    min_ms: float
    n: int
    samples_ms: list[float]
    clock: Literal["cuda_events", "monotonic"]
    l2_flushed: bool
    # what each timed call ran: "drop-in" (the module a PR would add, bound to the kernel), "library" (the kernel
    # library called directly), "module" (a ModelNew, or a baseline); "" where not recorded
    call: str = ""
    # the host's time per call (median, ms, from the flush's launch to the call's return; on CUDA not inside the
    # GPU times) and the longest GPU spin a kept sample ran behind so that it is not (runner.harness.timing)
    host_ms: float | None = None
    lead_ms: float = 0.0
    # the least time per call the parent's own clock allows (runner.harness.clocked): back-to-back calls timed by
    # the parent, less their steps timed in the judge (on CUDA less the reference's host work per call as the judge
    # measured it, at most half); a median under it was raised to it, the samples scaled alike. None where not
    # clocked (baselines). `host_ms` is the candidate's process's own report: shown, never used to decide
    parent_ms: float | None = None
    # what a user's call costs: ms per call in a loop of calls back to back through the module as shipped (the host
    # path included, the caches as the previous call left them), from the PR's bench script; None where not measured
    back_to_back_ms: float | None = None

    def call_text(self) -> str:
        """How the time was taken, for a report ("" where not recorded)."""
        return {"drop-in": "fusebot's time is the drop-in module's forward call (what a user runs: state lookup, "
                           "output allocation and the kernel)",
                "library": "fusebot's time is the kernel library's call",
                "module": "fusebot's time is the candidate module's forward call"}.get(self.call, "")

    def lead_text(self) -> str:
        """How the host's own work was kept out of a GPU time, for a report ("" where it was not)."""
        if self.lead_ms <= 0:
            return ""
        return ("each call's host work (its Python and launches) ran while the GPU was kept busy, so it is not in the "
                "GPU times; it is shown apart as host us per call")


class Roofline(_Model):
    bytes_moved: int
    bandwidth_bytes_per_s: float
    bandwidth_source: str
    floor_ms: float


class TrialResult(_Model):
    index: int
    shape_set: int  # 0: the problem's inputs, 1: its second declared shape
    distribution: str  # "factory" (the problem's own get_inputs) or "randn*S+O"
    passed: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatched: int = 0
    numel: int = 0
    reasons: list[InertStr] = Field(default_factory=list)
    notes: list[InertStr] = Field(default_factory=list)  # what the trial allowed and says (verify.spread_nonfinite)


class KernelResources(_Model):
    """What ptxas reports of one compiled CUDA kernel (`-Xptxas=-v`)."""

    name: str
    registers: int
    spill_stores_bytes: int = 0
    spill_loads_bytes: int = 0
    stack_bytes: int = 0
    shared_bytes: int = 0
    barriers: int = 0

    def text(self) -> str:
        spills = self.spill_stores_bytes + self.spill_loads_bytes
        return (f"{self.registers} registers, {spills} B spilled, {self.shared_bytes} B shared, "
                f"{self.stack_bytes} B stack")


class BuildInfo(_Model):
    ok: bool
    seconds: float
    cached: bool = False
    log: InertStr = ""
    compiler: str = ""
    kernels: list[KernelResources] = Field(default_factory=list)  # CUDA: each kernel's registers, spills, memory

    def kernels_text(self) -> str:
        """One line for a report or a prompt: what ptxas reported of each kernel ("" where it reported nothing)."""
        return "; ".join(f"{k.name}: {k.text()}" for k in self.kernels)


class Environment(_Model):
    device: str
    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str
    python: str
    fusebot: str
    cpu: str | None = None
    sandbox: dict[str, bool] = Field(default_factory=dict)


class Baselines(_Model):
    eager: Timing | None = None
    compile: Timing | None = None
    compile_error: InertStr | None = None


class Confirmation(_Model):
    """The winner re-timed against both baselines in alternating rounds (candidate, eager, compile, candidate, ...),
    one candidate process for all rounds (a bench script's figures: `processes` runs one after the other, pooled):
    per-round medians and speedups, so a claim carries its spread."""

    rounds: int
    processes: int = 1
    candidate_ms: list[float]
    eager_ms: list[float]
    compile_ms: list[float] = Field(default_factory=list)
    speedup_vs_eager: list[float]
    speedup_vs_compile: list[float] = Field(default_factory=list)

    def speedup_vs_faster(self) -> list[float]:
        """Per round: the faster baseline of that round over the candidate."""
        pairs = zip(self.eager_ms, self.compile_ms or self.eager_ms, self.candidate_ms, strict=True)
        return [min(e, c) / k for e, c, k in pairs]


class Verdict(_Model):
    """The harness's word on one candidate. `accepted` is true only if every check passed; `reasons` names each
    failed check (e.g. "side-stream: ..."); `warnings` holds what is true but must be said (e.g. below the floor)."""

    schema_version: int = SCHEMA_VERSION
    candidate_id: str
    problem: str
    accepted: bool
    reasons: list[InertStr] = Field(default_factory=list)
    warnings: list[InertStr] = Field(default_factory=list)
    stage: Literal["build", "load", "verify", "time", "done"] = "done"
    build: BuildInfo | None = None
    trials: list[TrialResult] = Field(default_factory=list)
    timing: Timing | None = None
    baselines: Baselines | None = None
    roofline: Roofline | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    pct_of_floor: float | None = None
    degenerate: bool = False  # the reference ignores its input or is near-constant: no speedup is reportable
    below_floor_confirmed: bool = False
    confirmation: Confirmation | None = None
    environment: Environment | None = None
    harness_seconds: float = 0.0
    stage_seconds: dict[str, float] = Field(default_factory=dict)  # build, load, verify, time


# ---- bot <-> runner: a job in, a result out ------------------------------------------------------------------


class TargetSpec(_Model):
    """A marked module in a repository, as the bot found it."""

    name: str
    file: str
    class_name: str
    inputs: str = "get_inputs"
    init_inputs: str | None = "get_init_inputs"
    init_args: list = Field(default_factory=list)
    init_kwargs: dict = Field(default_factory=dict)
    second_inputs: str | None = None
    input_shapes: list[list[int]] | None = None  # set: random inputs of these shapes and `dtype`, not `inputs`
    dtype: DType | None = None
    atol: float | None = None
    rtol: float | None = None


class SearchBudget(_Model):
    rounds: int = 3
    ideas_per_round: int = 4
    implementations_per_idea: int = 2
    beam: int = 3
    max_repairs: int = 4  # up to 5 tries: the answer, then 4 repairs fed with the chain of attempts
    wall_seconds: float = 300.0
    gpu_seconds: float | None = None
    tokens: int | None = None
    candidates: int | None = None


class Job(_Model):
    """One unit of runner work. Fields added after schema version 1 have defaults, so every version-1 payload still
    parses (as a search)."""

    schema_version: int = SCHEMA_VERSION
    id: str
    repo: str  # owner/name
    sha: str
    ref: str | None = None
    trigger: Literal["label", "comment", "schedule", "check_run", "dispatch", "demo"] = "label"
    pr_number: int | None = None
    targets: list[TargetSpec]  # search: the marked modules; empty for benchmark and hygiene
    budget: SearchBudget = Field(default_factory=SearchBudget)
    models: list[str] = Field(default_factory=list)
    kind: JobKind = "search"
    kernels_dir: str = "fusebot_kernels"  # where the repository keeps fusebot's kernels (the config's kernels_dir)
    kernels: list[str] = Field(default_factory=list)  # benchmark, hygiene: the folders under kernels_dir; empty: all


class DropinCheck(_Model):
    """The runner's own run of a generated drop-in and its test before it accepts a result (runner/results/files.py)."""

    passed: bool
    command: str
    passed_tests: int = 0
    failed_tests: int = 0
    skipped_tests: int = 0
    seconds: float = 0.0
    reasons: list[str] = Field(default_factory=list)
    output_tail: str = ""


# In TargetResult.files, this text means "delete the file" (nightly hygiene removing a stale kernel): NUL never occurs in
# a source file.
REMOVED_FILE = "\0fusebot:removed\0"


class TargetResult(_Model):
    target: str
    improved: bool
    verdict: Verdict | None = None
    message: str = ""  # e.g. "nothing beat torch.compile (0.51 ms)"
    files: dict[str, str] = Field(default_factory=dict)  # path relative to the kernels directory -> text
    trace_markdown: str = ""
    dropin_check: DropinCheck | None = None
    file: str | None = None  # the module's file in the repository, e.g. "models/blocks.py"
    class_name: str | None = None
    kernel: str | None = None  # benchmark, hygiene: the kernel source measured, e.g. "fusebot_kernels/x/kernel.cu"


class JobResult(_Model):
    schema_version: int = SCHEMA_VERSION
    job_id: str
    ok: bool
    targets: list[TargetResult] = Field(default_factory=list)
    environment: Environment | None = None
    error: str | None = None


class Progress(_Model):
    round: int = 0
    built: int = 0
    verified: int = 0
    rejected: int = 0
    best_speedup: float | None = None
    message: str = ""


# ---- what a verdict's numbers say: read by the bot's PR bodies and the runner's reports alike -----------------------


def faster_baseline(baselines: Baselines | None) -> tuple[str, Timing] | None:
    """The faster of eager and torch.compile, as ("eager" or "torch.compile", its timing): the time a kernel must
    beat. A tie goes to torch.compile. None when neither was measured."""
    if baselines is None:
        return None
    options = [(name, t) for name, t in (("torch.compile", baselines.compile), ("eager", baselines.eager)) if t]
    return min(options, key=lambda nt: nt[1].median_ms) if options else None


def table_cell(text: str, limit: int = 160) -> str:
    """One markdown table cell: whitespace collapsed, pipes escaped, cut to `limit` characters."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table_row(label: str, t: Timing | None, baselines: Baselines | None, roofline: Roofline | None) -> str:
    if t is None:
        return f"| {label} | n/a | | | | | | |"
    eager = baselines.eager.median_ms / t.median_ms if baselines and baselines.eager else None
    comp = baselines.compile.median_ms / t.median_ms if baselines and baselines.compile else None
    floor = 100.0 * roofline.floor_ms / t.median_ms if roofline else None

    def fmt(x: float | None, unit: str) -> str:
        return f"{x:.2f}{unit}" if x is not None else "n/a"

    host = f"{t.host_ms * 1000:.0f}" if t.host_ms is not None else "n/a"
    return (f"| {label} | {t.median_ms:.4g} | {t.iqr_ms:.3g} | {t.n} | {fmt(eager, 'x')} | {fmt(comp, 'x')} | "
            f"{fmt(floor, '%')} | {host} |")


def benchmark_table(baselines: Baselines | None, timing: Timing | None, roofline: Roofline | None,
                    label: str = "fusebot") -> str:
    """The benchmark table (markdown): PyTorch eager, torch.compile (or why it failed), the kernel's row named
    `label` when it was timed, and the roofline floor when known. Columns: median ms, IQR ms, n, speedup over eager
    and over torch.compile, % of the roofline floor, the host's microseconds per call."""
    b, r = baselines, roofline
    lines = ["| | median ms | IQR ms | n | vs eager | vs torch.compile | % of floor | host us per call |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
             _table_row("PyTorch eager", b.eager if b else None, b, r)]
    if b and b.compile is None and b.compile_error:
        lines.append(f"| torch.compile | failed: {table_cell(b.compile_error, 80)} | | | | | | |")
    else:
        lines.append(_table_row("torch.compile", b.compile if b else None, b, r))
    if timing is not None:
        lines.append(_table_row(label, timing, b, r))
    if r:
        lines.append(f"| roofline floor | {r.floor_ms:.4g} | | | | | 100% | |")
    return "\n".join(lines)
