"""Find what to optimise: a shallow clone at a pinned SHA, then targets from the config plus source markers.

A source marker is the comment `# fusebot: optimize` (any case) on the line directly above a class (or above its
decorators), in a file that also defines `get_inputs` and `get_init_inputs` at module level (the KernelBench
convention). A marked file that does not parse, or lacks those functions, is a problem at its own line; a config target
whose file or class is missing is a config problem at the config's line (`check_config_targets`), found before any job
is queued.
fusebot's own kernels are found by their manifests: `<kernels_dir>/<folder>/fusebot.json` (`kernel_folders`).
"""

from __future__ import annotations

import ast
import fnmatch
import logging
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import git

from bot.logs import redact
from bot.repo.config import CONFIG_PATH, ConfigError, ConfigProblem, FusebotConfig, TargetConfig, line_of
from runner.contract import MANIFEST_FILE, TargetSpec

log = logging.getLogger(__name__)

MARKER = "# fusebot: optimize"
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".tox"}
MAX_FILE_BYTES = 1_000_000
SECOND_INPUTS = "get_second_inputs"  # a marked module's optional second shape (KernelBench style, docs/harness.md)


class CloneError(Exception):
    """The repository could not be fetched at the pinned commit."""


def clone_at(url: str, sha: str, dest: Path) -> Path:
    """A depth-1 checkout of exactly `sha` (fetch by commit id, as GitHub allows), with no credentials kept."""
    dest.mkdir(parents=True, exist_ok=True)
    repo = git.Repo.init(dest)
    try:
        # the URL (and any token in it) is passed for this one fetch and never written to .git/config
        repo.git.fetch("--depth=1", "--no-tags", url, sha)
        repo.git.checkout("--detach", "--force", "FETCH_HEAD")
    except git.GitCommandError as e:
        stderr = (e.stderr or "").replace(url, "<remote>").replace(url.split("://", 1)[-1], "<remote>")
        stderr = redact(stderr)
        raise CloneError(f"fetch of {sha} failed: {stderr.strip()[-500:]}") from None
    head = repo.head.commit.hexsha
    if head != sha and not head.startswith(sha):
        raise CloneError(f"fetched {head}, expected {sha}")
    return dest


def checkout_cached(url: str, sha: str, cache_dir: Path) -> Path:
    """`clone_at` into cache_dir/sha, reused when already there (the same commit is never fetched twice)."""
    final = cache_dir / sha
    if (final / ".git").is_dir():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}-", dir=cache_dir))
    try:
        clone_at(url, sha, tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another thread won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def make_tarball(worktree: Path, dest: Path) -> Path:
    """The job's source: the checkout without .git, as .tar.gz, written atomically."""
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(worktree.rglob("*")):
            rel = path.relative_to(worktree)
            if rel.parts[0] == ".git" or path.is_symlink() or not path.is_file():
                continue
            tar.add(path, arcname=str(rel), recursive=False)
    os.replace(tmp, dest)
    return dest


def read_config_text(worktree: Path) -> str | None:
    p = worktree / CONFIG_PATH
    return p.read_text(errors="replace") if p.is_file() else None


def _ignored(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.rstrip("/") + "/*") for p in patterns)


def _target_name(rel: str, cls: str) -> str:
    return rel.removesuffix(".py").replace("/", ".") + "." + cls


@dataclass(frozen=True)
class SourceProblem:
    """Why a file of the repository cannot be optimised as it is: its path, the 1-based line, and what to fix."""

    path: str
    line: int
    message: str


@dataclass(frozen=True)
class Found:
    targets: list[TargetSpec]
    problems: list[SourceProblem] = field(default_factory=list)


@dataclass(frozen=True)
class Module:
    """What discovery reads from a module's source: its classes (name -> 1-based line of the class or its first
    decorator), those marked `# fusebot: optimize`, and its top-level functions."""

    classes: dict[str, int]
    marked: list[str]
    functions: set[str]

    @property
    def has_factories(self) -> bool:
        return {"get_inputs", "get_init_inputs"} <= self.functions


def read_module(source: str) -> Module:
    """Parse a module's source; raises SyntaxError as Python does."""
    tree = ast.parse(source)
    lines = source.splitlines()
    classes, marked = {}, []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])  # 1-based
        classes[node.name] = first
        if first >= 2 and lines[first - 2].strip().lower() == MARKER:
            marked.append(node.name)
    return Module(classes, marked, {n.name for n in tree.body if isinstance(n, ast.FunctionDef)})


def syntax_problem(rel: str, e: SyntaxError) -> SourceProblem:
    return SourceProblem(rel, e.lineno or 1, f"syntax error: {e.msg}")


def marked_classes(source: str) -> list[str]:
    """Classes marked `# fusebot: optimize`, in a module defining get_inputs and get_init_inputs."""
    try:
        module = read_module(source)
    except SyntaxError:
        return []
    return module.marked if module.has_factories else []


def scan(worktree: Path, ignore: Iterable[str] = ()) -> Found:
    """Every marked class under `worktree`, and the marked files that cannot be used as they are (a syntax error, no
    input factories)."""
    ignore = list(ignore)
    found, problems = [], []
    for dirpath, dirnames, filenames in os.walk(worktree):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for fn in sorted(filenames):
            if not fn.endswith(".py"):
                continue
            path = Path(dirpath) / fn
            rel = path.relative_to(worktree).as_posix()
            if _ignored(rel, ignore) or path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(errors="replace")
            if MARKER not in text.lower():
                continue
            try:
                module = read_module(text)
            except SyntaxError as e:
                problems.append(syntax_problem(rel, e))
                continue
            if module.marked and not module.has_factories:
                problems.append(SourceProblem(rel, module.classes[module.marked[0]], "marked `# fusebot: optimize`, "
                                              "but the module defines no get_inputs() and get_init_inputs()"))
                continue
            second = SECOND_INPUTS if SECOND_INPUTS in module.functions else None
            for cls in module.marked:  # a declared second shape is verified too (it catches kernels with sizes baked in)
                found.append(TargetSpec(name=_target_name(rel, cls), file=rel, class_name=cls, second_inputs=second))
    return Found(found, problems)


def scan_markers(worktree: Path, ignore: Iterable[str] = ()) -> list[TargetSpec]:
    return scan(worktree, ignore).targets


def marked_targets(root: Path, kernels_dir: str = "fusebot_kernels") -> list[TargetSpec]:
    """The marked classes under `root`, each named by its class alone (one kernel folder per class: the demo's and
    the device scripts' naming), fusebot's own kernels left out."""
    return [t.model_copy(update={"name": t.class_name}) for t in scan_markers(root, [kernels_dir])]


def from_config(t: TargetConfig) -> TargetSpec:
    return TargetSpec(
        name=t.name or _target_name(t.file, t.class_name),
        file=t.file,
        class_name=t.class_name,
        inputs=t.inputs or "get_inputs",
        init_inputs=t.init_inputs if t.init_inputs is not None else ("get_init_inputs" if t.shapes is None else None),
        input_shapes=t.shapes,
        init_args=t.init_args,
        init_kwargs=t.init_kwargs,
        dtype=t.dtype,
        atol=t.tolerance.atol if t.tolerance else None,
        rtol=t.tolerance.rtol if t.tolerance else None,
    )


def check_config_targets(worktree: Path, config: FusebotConfig, text: str | None, path: str = CONFIG_PATH) -> None:
    """The config's targets checked against the code at this commit: each file exists and defines its class. Raises
    ConfigError with each problem at the config's own line. A file that does not parse is left to `find_targets`,
    which reports it at the file's line."""
    problems = []
    for i, t in enumerate(config.targets):
        source = worktree / t.file
        if not source.is_file() or source.is_symlink():
            problems.append(ConfigProblem(path, line_of(text, ("targets", i, "file")),
                                          f"targets.{i}.file: {t.file} does not exist at this commit"))
            continue
        try:
            module = read_module(source.read_text(errors="replace"))
        except SyntaxError:
            continue
        if t.class_name not in module.classes:
            problems.append(ConfigProblem(path, line_of(text, ("targets", i, "class")),
                                          f"targets.{i}.class: {t.file} defines no class {t.class_name}"))
    if problems:
        raise ConfigError(problems)


def find_targets(
    worktree: Path,
    targets: list[TargetConfig],
    *,
    markers: bool = True,
    ignore: Iterable[str] = (),
    changed_files: Iterable[str] | None = None,
) -> Found:
    """Config targets first, then marked classes not already named by the config; restricted to files in
    `changed_files` when given (a PR trigger without `run all`). Problems: marked files and config targets' files that
    cannot be used as they are (within `changed_files` too)."""
    ignore = list(ignore)
    out = [from_config(t) for t in targets if not _ignored(t.file, ignore)]
    problems = []
    for t in out:
        try:
            read_module((worktree / t.file).read_text(errors="replace"))
        except SyntaxError as e:
            problems.append(syntax_problem(t.file, e))
        except OSError:
            pass  # a missing file is the config's problem (check_config_targets)
    seen = {(t.file, t.class_name) for t in out}
    if markers:
        marked = scan(worktree, ignore)
        out += [t for t in marked.targets if (t.file, t.class_name) not in seen]
        problems += [p for p in marked.problems if p not in problems]
    broken = {p.path for p in problems}
    out = [t for t in out if t.file not in broken]
    if changed_files is not None:
        changed = set(changed_files)
        out = [t for t in out if t.file in changed]
        problems = [p for p in problems if p.path in changed]
    return Found(out, problems)


def discover(
    worktree: Path,
    targets: list[TargetConfig],
    *,
    markers: bool = True,
    ignore: Iterable[str] = (),
    changed_files: Iterable[str] | None = None,
) -> list[TargetSpec]:
    """The targets of `find_targets`, without its problems."""
    return find_targets(worktree, targets, markers=markers, ignore=ignore, changed_files=changed_files).targets


def kernel_folders(worktree: Path, kernels_dir: str, only: Iterable[str] | None = None) -> list[str]:
    """The folders under `kernels_dir` that hold a fusebot kernel (a manifest), restricted to `only` when given."""
    base = worktree / kernels_dir
    if not base.is_dir() or base.is_symlink():
        return []
    wanted = set(only) if only is not None else None
    return sorted(m.parent.name for m in base.glob(f"*/{MANIFEST_FILE}")
                  if m.is_file() and not m.is_symlink() and (wanted is None or m.parent.name in wanted))


def touched_kernel_folders(paths: Iterable[str], kernels_dir: str) -> list[str]:
    """The kernel folders that changed paths fall in: `<kernels_dir>/<folder>/...` -> folder."""
    prefix = kernels_dir.strip("/") + "/"
    return sorted({p[len(prefix):].split("/", 1)[0] for p in paths if p.startswith(prefix) and "/" in p[len(prefix):]})
