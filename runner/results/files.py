"""The result of one target as the files a pull request adds, and the runner's own check of them.

    files = target_files(spec, candidate, verdict, provenance)        # pure: path (under the kernels dir) -> text
    write_files(root / kernels_dir, files)
    check = check_dropin(root, kernels_dir, target)                     # runs the generated test: a DropinCheck
    result = target_result(...)                                         # the TargetResult the bot turns into a PR

Per target, under `<kernels_dir>/<target>/`: the kernel source with a provenance header, fusebot.h, the drop-in
module (dropin.py), its pytest test (test_<target>.py: a name of its own, so several targets' tests collect in one
pytest run), the benchmark script (bench_<target>.py, runner/results/bench_script.py), BENCHMARK.md and fusebot.json
(runner/results/proposal.py: what was verified, every timed contestant's figures, its raw samples left in the run's
result.json); for a KernelBench-format file,
the reference as reference.py. A PyTorch rewrite (runner/results/choice.py) instead changes the module's own file,
with BENCHMARK.md, fusebot.json and the bench script beside nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from runner.contract import MANIFEST_FILE, Candidate, DropinCheck, ProblemSpec, TargetResult, Timing, Verdict
from runner.harness import dropin
from runner.harness.confirm import margin as confirm_margin
from runner.harness.sandbox import confined_env
from runner.results.adoption import adopted
from runner.results.bench_script import KERNEL_LABEL, REWRITE_LABEL, bench_filename, bench_source
from runner.results.dropin_test import dropin_test_source
from runner.results.figures import stated
from runner.results.licence import NOASSERTION, licence_note, repo_licence, with_spdx
from runner.results.proposal import KERNEL, REWRITE, ROOT_PREFIX, Fallback, manifest_extra, unified_diff, without_samples
from runner.results.pytest_summary import pytest_summary, text_of
from runner.results.rewrite_test import rewrite_test_source
from runner.results.shapes import calls as shape_calls
from runner.results.shapes import verified_inputs
from runner.search.types import Attempt

log = logging.getLogger(__name__)

DEFAULT_KERNELS_DIR = "fusebot_kernels"
BENCHMARK_FILE = "BENCHMARK.md"
HEADER_SOURCE = Path(__file__).resolve().parents[1] / "csrc" / "fusebot.h"
CHECK_TIMEOUT_S = 600.0


class Provenance(BaseModel):
    """Where a kernel comes from, written into its header comment and BENCHMARK.md."""

    model_config = ConfigDict(extra="forbid")

    target: str
    repo: str = ""
    commit: str = ""
    device: str = ""  # the GPU (or CPU) it was verified and timed on
    date: str = ""  # ISO 8601, UTC
    fusebot: str = ""

    @classmethod
    def for_verdict(cls, target: str, verdict: Verdict | None, repo: str = "", commit: str = "",
                    now: datetime | None = None) -> Provenance:
        e = verdict.environment if verdict else None
        return cls(target=target, repo=repo, commit=commit, device=(e.gpu or e.cpu or e.device) if e else "",
                   date=(now or datetime.now(UTC)).isoformat(timespec="seconds"), fusebot=e.fusebot if e else "")


def slug(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]+", "_", name).strip("_").lower() or "target"


def dropin_test_filename(target: str) -> str:
    return f"test_{slug(target)}.py"


def kernel_header(p: Provenance, backend: str) -> str:
    lines = [f"fusebot kernel for {p.target}" + (f" in {p.repo}" if p.repo else ""),
             f"commit: {p.commit or 'n/a'}",
             f"verified and timed on: {p.device or 'n/a'} ({backend} backend)",
             f"date: {p.date or 'n/a'}",
             f"fusebot: {p.fusebot or 'n/a'}",
             "Generated code: review it as you would any contribution. Re-verify with the test beside it."]
    return "".join(f"// {line}\n" for line in lines) + "\n"


# ---- BENCHMARK.md ----------------------------------------------------------------------------------------------

def _ms(t: Timing | None) -> str:
    return f"{t.median_ms:.4g} | {t.iqr_ms:.3g} | {t.n}" if t else "n/a | | "


def _b2b(t: Timing | None) -> str:
    return f"{t.back_to_back_ms:.4g}" if t and t.back_to_back_ms is not None else "n/a"


def _ratio(base: Timing | None, t: Timing | None) -> str:
    return f"{base.median_ms / t.median_ms:.2f}x" if base and t and t.median_ms > 0 else "n/a"


def max_errors(v: Verdict) -> tuple[float | None, float | None]:
    abs_errs = [t.max_abs_err for t in v.trials if t.max_abs_err is not None]
    rel_errs = [t.max_rel_err for t in v.trials if t.max_rel_err is not None]
    return (max(abs_errs) if abs_errs else None, max(rel_errs) if rel_errs else None)


def benchmark_markdown(spec: ProblemSpec, v: Verdict, p: Provenance, test_path: str,
                       check: DropinCheck | None = None, *, bench_path: str = "", label: str = KERNEL_LABEL,
                       rewrite: Timing | None = None) -> str:
    """BENCHMARK.md: the table (with the PyTorch rewrite's row when one was verified), the floor, correctness, the
    environment, and how to reproduce: the bench script for the figures, pytest for correctness."""
    b, t = v.baselines, v.timing
    eager, comp = (b.eager if b else None), (b.compile if b else None)
    rows = ["| | median ms | IQR ms | n | vs eager | vs torch.compile | a user's call, back to back (ms) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| PyTorch eager | {_ms(eager)} | 1.00x | {_ratio(comp, eager)} | {_b2b(eager)} |"]
    if comp is None and b and b.compile_error:
        rows.append(f"| torch.compile | failed: {' '.join(b.compile_error.split())[:120]} | | | | | |")
    else:
        rows.append(f"| torch.compile | {_ms(comp)} | {_ratio(eager, comp)} | {_ratio(comp, comp) if comp else 'n/a'} "
                    f"| {_b2b(comp)} |")
    rows.append(f"| {label} | {_ms(t)} | {_ratio(eager, t)} | {_ratio(comp, t)} | {_b2b(t)} |")
    if rewrite is not None and label != REWRITE_LABEL:
        rows.append(f"| {REWRITE_LABEL} | {_ms(rewrite)} | {_ratio(eager, rewrite)} | {_ratio(comp, rewrite)} "
                    f"| {_b2b(rewrite)} |")
    if v.roofline:
        pct = f" (the kernel runs at {v.pct_of_floor:.0f}% of it)" if v.pct_of_floor is not None else ""
        roof = (f"Roofline floor: {v.roofline.floor_ms:.4g} ms for {v.roofline.bytes_moved} bytes at "
                f"{v.roofline.bandwidth_bytes_per_s / 1e9:.1f} GB/s ({v.roofline.bandwidth_source}){pct}.")
    else:
        roof = "Roofline floor: not measured."
    if v.build and v.build.kernels:
        roof += f" Compiled (ptxas): {v.build.kernels_text()}."
    passed = sum(1 for tr in v.trials if tr.passed)
    abs_err, rel_err = max_errors(v)
    shapes = sorted({tr.shape_set for tr in v.trials})
    e = v.environment
    env = (f"{e.gpu or e.cpu or e.device}; driver {e.driver or 'n/a'}; CUDA {e.cuda or 'n/a'}; torch {e.torch}; "
           f"Python {e.python}; fusebot {e.fusebot}") if e else "n/a"
    out = [f"# {spec.name}: fusebot benchmark", "",
           f"`{spec.class_name}` from `{spec.module or Path(spec.path or '').name}`, verified and timed on {p.device or 'n/a'} "
           f"at commit {p.commit or 'n/a'} ({p.date or 'n/a'}).", "",
           *rows, "", roof, "",
           f"Correctness: {passed} of {len(v.trials)} trials passed on {len(shapes)} shape set(s) and "
           f"{len({tr.distribution for tr in v.trials})} input distribution(s); largest absolute error "
           f"{abs_err if abs_err is not None else 'n/a'}, largest relative error {rel_err if rel_err is not None else 'n/a'}.",
           "", f"Environment: {env}.", "",
           "Times are medians of n calls with the last-level cache flushed before each (the kernel's own time); "
           "spread is the interquartile range. A user's call is the module as shipped (for the kernel: the drop-in, "
           "its guard and host path included) called back to back in a loop, ms per call, caches as the previous "
           "call left them: what a loop of calls pays, measured by the bench script. fusebot.json beside this "
           "file holds each contestant's median, IQR and n; the raw samples stay "
           "in the run's result (result.json), out of this branch."
           + (f" {v.timing.call_text().capitalize()}." if v.timing and v.timing.call_text() else "")
           + (f" {v.timing.lead_text().capitalize()} in the run's report." if v.timing and v.timing.lead_text() else ""),
           ""]
    if check is not None:
        out += [f"Drop-in check before this was proposed: `{check.command}`: {check.passed_tests} passed, "
                f"{check.failed_tests} failed, {check.skipped_tests} skipped ({check.seconds:.1f} s).", ""]
    out += ["## Reproduce", ""]
    if bench_path:
        out += ["The figures (the original against this change, timed as above in alternating rounds; needs only "
                "torch):", "", f"    python {bench_path}", ""]
    if test_path:
        out += ["Correctness (the change against the original on every declared shape; pytest checks correctness "
                "only, it times nothing):", "", f"    python -m pytest -q {test_path}", ""]
    return "\n".join(out)


# ---- the files -------------------------------------------------------------------------------------------------

def target_files(spec: ProblemSpec, candidate: Candidate, verdict: Verdict, provenance: Provenance, *,
                 kernels_dir: str = DEFAULT_KERNELS_DIR, reference_text: str | None = None,
                 check: DropinCheck | None = None, extra: dict | None = None,
                 licence: tuple[str, str] = (NOASSERTION, ""), module_file: str = "",
                 module_text: str | None = None) -> dict[str, str]:
    """The files of one improved target: path relative to the kernels directory -> text. `extra`: what the manifest
    says beyond the kernel (runner.results.proposal.manifest_extra); `licence`: (SPDX id, where the repository
    declares it), each file's licence line (runner/results/licence.py). With the marked module's repository path
    `module_file` and its text, that file adopting the drop-in (runner/results/adoption.py; key: "/" + its path). Pure."""
    if candidate.format != "fast":
        raise ValueError(f"{candidate.id}: only fast-format kernels become drop-ins (got {candidate.format})")
    folder = slug(spec.name)
    kernel_name = dropin.kernel_filename(candidate.backend)
    source = candidate.sources.get(kernel_name) or next(iter(candidate.sources.values()))

    digest = hashlib.sha256(source.encode()).hexdigest()
    built_for = provenance.device
    if verdict.environment and verdict.environment.cuda:
        built_for = f"{provenance.device} (CUDA {verdict.environment.cuda})"
    root_depth = len(Path(kernels_dir).parts) if spec.module else None
    test_name = dropin_test_filename(spec.name)
    bench = bench_filename(folder)
    rewrite = _rewrite_timing(extra)
    ships = dropin.shipped(spec, candidate, digest, built_for=built_for, root_depth=root_depth,
                           calls=shape_calls({"shape_sets": ((extra or {}).get("verified") or {}).get("shapes", [])}))
    files = {
        f"{folder}/{kernel_name}": kernel_header(provenance, candidate.backend) + source,
        f"{folder}/{dropin.HEADER_FILE}": HEADER_SOURCE.read_text(),
        **{f"{folder}/{name}": text for name, text in ships.files.items()},  # the drop-in and what it ships
        f"{folder}/{test_name}": dropin_test_source(spec, candidate.backend),
        f"{folder}/{BENCHMARK_FILE}": benchmark_markdown(spec, verdict, provenance,
                                                         f"{kernels_dir}/{folder}/{test_name}", check,
                                                         bench_path=f"{kernels_dir}/{folder}/{bench}",
                                                         rewrite=rewrite),
        f"{folder}/{bench}": bench_source(spec, backend=candidate.backend, target_folder=folder,
                                          kernels_dir=kernels_dir),
    }
    shipping = {"no_device_code": ships.no_device_code} if ships.no_device_code else {}
    files[f"{folder}/{MANIFEST_FILE}"] = json.dumps(without_samples(manifest(spec, candidate, kernel_name)
                                                                    | (extra or {}) | shipping
                                                                    | {"licence": licence[0]}),
                                                    indent=1) + "\n"
    files[f"{folder}/{BENCHMARK_FILE}"] += "\n" + licence_note(*licence) + "\n"
    if all(part.isidentifier() for part in (*Path(kernels_dir).parts, folder)):  # importable as a package
        files["__init__.py"] = ""
        files[f"{folder}/__init__.py"] = ""
    if spec.path and reference_text is not None:
        files[f"{folder}/{dropin.REFERENCE_FILE}"] = reference_text
    edited = adopted(module_text, spec.class_name, f"{kernels_dir}/{folder}") \
        if spec.module and module_file and module_text is not None else None
    if edited is not None and edited != module_text:
        files[f"{ROOT_PREFIX}{module_file}"] = edited
    return with_spdx(files, licence[0], skip=(f"{folder}/{dropin.REFERENCE_FILE}",))


def manifest(spec: ProblemSpec, candidate: Candidate, kernel_name: str) -> dict:
    """What re-verifying this kernel needs (runner/results/remeasure.py): the problem and how the kernel is built."""
    return {"schema_version": 1, "problem": spec.model_dump(exclude={"path", "root"}), "kernel": kernel_name,
            "backend": candidate.backend, "extra_cflags": list(candidate.extra_cflags), "candidate": candidate.id}


def _rewrite_timing(extra: dict | None) -> Timing | None:
    """The PyTorch rewrite's timing from a manifest's `timings`, when it was verified beside the kernel."""
    t = ((extra or {}).get("timings") or {}).get(REWRITE_LABEL)
    if not t:
        return None
    samples = t["samples_ms"]
    return Timing(median_ms=t["median_ms"], iqr_ms=t["iqr_ms"], mean_ms=sum(samples) / len(samples),
                  min_ms=min(samples), n=t["n"], samples_ms=samples, clock=t["clock"], l2_flushed=True)


def rewrite_files(spec: ProblemSpec, candidate: Candidate, verdict: Verdict, provenance: Provenance, *,
                  module_file: str, original_text: str, kernels_dir: str = DEFAULT_KERNELS_DIR,
                  extra: dict | None = None, licence: tuple[str, str] = (NOASSERTION, "")) -> dict[str, str]:
    """The files of a PyTorch rewrite: the module's file with its new text (key: "/" + its repository path), and in
    the kernels directory BENCHMARK.md, fusebot.json (with the diff) and the bench script. Pure."""
    folder = slug(spec.name)
    bench = bench_filename(folder)
    test_name = dropin_test_filename(spec.name)
    new_text = getattr(candidate, "rewrite", "")
    diff = unified_diff(module_file, original_text, new_text)
    data = {"schema_version": 1, "problem": spec.model_dump(exclude={"path", "root"}), "kind": REWRITE,
            "module_file": module_file, "candidate": candidate.id,
            "preconditions": list(getattr(candidate, "preconditions", []))} | (extra or {}) | {
                "diff": diff, "licence": licence[0]}
    return with_spdx({
        f"{ROOT_PREFIX}{module_file}": new_text,
        f"{folder}/{BENCHMARK_FILE}": benchmark_markdown(spec, verdict, provenance,
                                                         f"{kernels_dir}/{folder}/{test_name}", None,
                                                         bench_path=f"{kernels_dir}/{folder}/{bench}",
                                                         label=REWRITE_LABEL) + "\n" + licence_note(*licence) + "\n",
        f"{folder}/{test_name}": rewrite_test_source(spec, backend=candidate.backend, target_folder=folder,
                                                     kernels_dir=kernels_dir),
        f"{folder}/{bench}": bench_source(spec, backend=candidate.backend, target_folder=folder,
                                          kernels_dir=kernels_dir, kind=REWRITE, module_file=module_file,
                                          commit=provenance.commit),
        f"{folder}/{MANIFEST_FILE}": json.dumps(without_samples(data), indent=1) + "\n",
    }, licence[0])


def write_files(kernels_root: Path, files: dict[str, str]) -> list[Path]:
    """Write `files` under the kernels directory; a key starting with "/" (a rewrite's module, a repository path)
    is not written here: it is published at its own path."""
    written = []
    for rel, text in files.items():
        if rel.startswith(ROOT_PREFIX):
            continue
        path = kernels_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


# ---- the check -------------------------------------------------------------------------------------------------

def check_dropin(root: Path, kernels_dir: str, target: str, *, timeout_s: float = CHECK_TIMEOUT_S,
                 env: dict[str, str] | None = None) -> DropinCheck:
    """Run the generated test of `target` (which builds and runs the drop-in) from the repository root `root`.

    Passed only when pytest exits 0 and at least one test ran: a test that was skipped everywhere (a CUDA kernel on a
    machine without a GPU) verifies nothing."""
    test = f"{kernels_dir}/{slug(target)}/{dropin_test_filename(target)}"
    # The test imports the repository's code: it runs confined like every other untrusted process (writes only under
    # the scratch copy `root`, no network, no credentials in its environment, caches and temporary files under root).
    cmd = [sys.executable, "-m", "runner.harness.sandbox", "--write", str(root), "--",
           sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root), test]
    run_env = confined_env(root, base=dict(env if env is not None else os.environ))
    run_env["FUSEBOT_DROPIN_CACHE"] = str(root / ".fusebot-dropin-cache")
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):  # the test runs as the PR ships it, not with the runner's options
        run_env.pop(name, None)
    # torch.compile's caches under root too: a cache the caller's environment names lies outside what the sandbox
    # may write, and torch._dynamo then fails to import (and, imported again, fails on its registry)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        run_env[name] = str(root / f".{name.lower()}")
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=root, env=run_env, capture_output=True, text=True, timeout=timeout_s)
        stdout, output, rc = done.stdout, done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        stdout, output, rc = text_of(e.stdout), text_of(e.stdout) + text_of(e.stderr), None
    seconds = time.monotonic() - start
    summary, counts = pytest_summary(stdout)
    reasons = []
    if rc is None:
        reasons.append(f"the generated test did not finish within {timeout_s:.0f} s")
    elif rc != 0:
        reasons.append(f"the generated test failed (pytest exit status {rc}): {summary}")
    elif counts["passed"] == 0:
        reasons.append(f"the generated test ran nothing here ({summary}): nothing was verified")
    shown = " ".join(["python -m pytest -q", test])
    return DropinCheck(passed=not reasons, command=shown, passed_tests=counts["passed"],
                       failed_tests=counts["failed"] + counts["error"], skipped_tests=counts["skipped"],
                       seconds=seconds, reasons=reasons, output_tail=output[-4000:])


def target_result(spec: ProblemSpec, improved: bool, message: str, candidate: Candidate | None,
                  verdict: Verdict | None, provenance: Provenance, trace_markdown: str, *, root: Path,
                  kernels_dir: str = DEFAULT_KERNELS_DIR, file: str | None = None,
                  reference_text: str | None = None, check_env: dict[str, str] | None = None,
                  change: str = KERNEL, choice: str = "", margin: float | None = None,
                  rewrite: Attempt | None = None, fallback: Fallback | None = None,
                  timeout_s: float | None = None) -> TargetResult:
    """The TargetResult of one searched target. An improved result's files are written under `root` (a scratch copy
    of the repository) and its generated test is run there; if that check fails the result is not improved.
    `timeout_s`: what is left of the target's budget for that check and the bench script (default: their own).
    `change`, `choice`, `margin`, `rewrite`, `fallback`: what the outcome chose and why
    (runner.results.outcome.proposal). A kernel that fails its generated test or its bench script gives way to the
    PyTorch rewrite when `fallback` says the rewrite cleared its own margin."""
    base = {"target": spec.name, "verdict": verdict, "trace_markdown": trace_markdown, "file": file,
            "class_name": spec.class_name}
    if not improved or candidate is None or verdict is None:
        return TargetResult(improved=False, message=_with_choice(message, choice), **base)
    licence = repo_licence(root)
    rewrite_t = rewrite.verdict.timing if rewrite is not None and rewrite.verdict and rewrite.candidate and \
        rewrite.candidate.id != candidate.id else None
    extra = manifest_extra(verdict, backend=candidate.backend, change=change, choice=choice, margin=margin,
                           verified=verified_inputs(spec), rewrite=rewrite_t)
    if change == REWRITE:
        if not file or not getattr(candidate, "rewrite", ""):
            return TargetResult(improved=False, message="a PyTorch rewrite was chosen but its module file is not "
                                "known: nothing is proposed", **base)
        files = rewrite_files(spec, candidate, verdict, provenance, module_file=file,
                              original_text=(root / file).read_text(), kernels_dir=kernels_dir, extra=extra,
                              licence=licence)
        write_files(root / kernels_dir, files)
        original = (root / file).read_text()
        (root / file).write_text(files[f"{ROOT_PREFIX}{file}"])  # the scratch copy as the PR's branch has it
        try:
            check = check_dropin(root, kernels_dir, spec.name, env=check_env,
                                 **({"timeout_s": min(timeout_s, CHECK_TIMEOUT_S)} if timeout_s else {}))
        finally:
            (root / file).write_text(original)  # another target of the same file diffs against the original
        if not check.passed:
            log.warning("%s: the PyTorch rewrite failed its equivalence test: %s", spec.name, "; ".join(check.reasons))
            why = _failure(check)
            return TargetResult(improved=False, dropin_check=check, **base,
                                message=f"the PyTorch rewrite was verified by the harness but changes what the module "
                                        f"does elsewhere ({why}); it is not proposed")
        return TargetResult(improved=True, message=_with_choice(message, choice), files=files, dropin_check=check,
                            **base)
    module = {"module_file": file, "module_text": (root / file).read_text()} if spec.module and file and \
        (root / file).is_file() else {}
    files = target_files(spec, candidate, verdict, provenance, kernels_dir=kernels_dir, reference_text=reference_text,
                         extra=extra, licence=licence, **module)
    write_files(root / kernels_dir, files)
    with _module_as_shipped(root, files):  # the check and the bench script run with the module's edit, as merged
        kernel = _checked_kernel(spec, message, candidate, verdict, provenance, base, root=root,
                                 kernels_dir=kernels_dir, reference_text=reference_text, check_env=check_env,
                                 change=change, choice=choice, margin=margin, rewrite_t=rewrite_t, timeout_s=timeout_s,
                                 licence=licence, module=module, extra=extra)
    if kernel.improved or fallback is None or rewrite is None or rewrite.candidate is None or rewrite.verdict is None:
        return kernel
    for rel in {*files, *kernel.files}:  # the kernel's files leave the scratch copy before the rewrite's come
        if not rel.startswith(ROOT_PREFIX):
            (root / kernels_dir / rel).unlink(missing_ok=True)
    why = kernel.message.removesuffix("; no kernel is proposed")
    log.info("%s: the kernel is not proposed (%s): the PyTorch rewrite is", spec.name, why)
    return target_result(spec, True, fallback.message, rewrite.candidate, rewrite.verdict, provenance, trace_markdown,
                         root=root, kernels_dir=kernels_dir, file=file, reference_text=reference_text,
                         check_env=check_env, change=REWRITE, margin=fallback.margin, timeout_s=timeout_s,
                         choice=f"{why}: the PyTorch rewrite, which cleared its own margin, is proposed instead")


@contextlib.contextmanager
def _module_as_shipped(root: Path, files: dict[str, str]) -> Iterator[None]:
    """The repository files a result changes (the key "/" + path) written under `root` while inside, then put back."""
    was = {rel[1:]: (root / rel[1:]).read_text() for rel in files if rel.startswith(ROOT_PREFIX)}
    try:
        for rel, text in files.items():
            if rel.startswith(ROOT_PREFIX):
                (root / rel[1:]).write_text(text)
        yield
    finally:
        for rel, text in was.items():
            (root / rel).write_text(text)


def _checked_kernel(spec: ProblemSpec, message: str, candidate: Candidate, verdict: Verdict, provenance: Provenance,
                    base: dict, *, root: Path, kernels_dir: str, reference_text: str | None,
                    check_env: dict[str, str] | None, change: str, choice: str, margin: float | None,
                    rewrite_t: Timing | None, timeout_s: float | None, licence: tuple[str, str],
                    module: dict, extra: dict) -> TargetResult:
    """A kernel's result once its files are written: its generated test run, its bench script's figures (CUDA), its
    files made again with the check that passed."""
    check = check_dropin(root, kernels_dir, spec.name, env=check_env,
                         **({"timeout_s": min(timeout_s, CHECK_TIMEOUT_S)} if timeout_s else {}))
    if not check.passed:
        log.warning("%s: the generated drop-in failed its own check: %s", spec.name, "; ".join(check.reasons))
        return TargetResult(improved=False, dropin_check=check, **base,
                            message=f"the kernel was verified by the harness but its generated drop-in failed its own "
                                    f"test ({'; '.join(check.reasons)}); no kernel is proposed")
    if candidate.backend == "cuda":  # the figures the PR states are its bench script's (runner/results/figures.py)
        verdict, holds, why = stated(root, kernels_dir, slug(spec.name), spec.name, verdict, check,
                                     backend=candidate.backend, timeout_s=timeout_s)
        base["verdict"] = verdict
        message = f"{message}; its bench script, run here: {why}"
        if not holds:
            log.warning("%s: the PR's bench script does not hold the claim: %s", spec.name, why)
            return TargetResult(improved=False, dropin_check=check, **base,
                                message=f"the kernel won in the harness, but its bench script, run here, says: "
                                        f"{why}; no kernel is proposed")
        if verdict.confirmation is not None and margin is not None:
            margin = confirm_margin(verdict.confirmation)
        extra = manifest_extra(verdict, backend=candidate.backend, change=change, choice=choice, margin=margin,
                               verified=verified_inputs(spec), rewrite=rewrite_t)
    files = target_files(spec, candidate, verdict, provenance, kernels_dir=kernels_dir, reference_text=reference_text,
                         check=check, extra=extra, licence=licence, **module)  # BENCHMARK.md names the check
    write_files(root / kernels_dir, files)
    return TargetResult(improved=True, message=_with_choice(message, choice), files=files, dropin_check=check,
                        **base)


def _failure(check: DropinCheck) -> str:
    """The generated test's own words for what failed (its assertion), else the check's reasons."""
    found = re.findall(r"AssertionError: (.+)", check.output_tail)
    return found[-1][:600] if found else "; ".join(check.reasons)


def _with_choice(message: str, choice: str) -> str:
    return f"{message}; {choice}" if choice else message
