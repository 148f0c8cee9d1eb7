"""`FILE[:CLASS]`: what `fusebot optimize` and `fusebot eval` read as the problem.

    examples/row_gain.py            the one class marked `# fusebot: optimize` (bot/repo/discovery.py reads the marker
                                    and the module's get_inputs / get_init_inputs, as it does for a repository)
    examples/row_gain.py:RowGain    that class, marked or not, with the module's input factories
    problems/softmax.py             a KernelBench file: class Model, get_inputs(), get_init_inputs()

A file that marks several classes and names none is a usage error listing them; so is a file with neither a marked
class nor a `Model`. A `get_second_inputs()` beside `get_inputs()` declares a second shape, for either kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bot.repo.discovery import MARKER, read_module
from runner.contract import ProblemSpec
from runner.errors import UsageError

KERNELBENCH_CLASS = "Model"


@dataclass(frozen=True)
class Target:
    path: Path
    class_name: str | None  # None: not named on the command line

    def __str__(self) -> str:
        return f"{self.path}:{self.class_name}" if self.class_name else str(self.path)


def parse_target(text: str) -> Target:
    """FILE or FILE:CLASS. A path that exists as given is a file, colon or not."""
    if Path(text).is_file() or ":" not in text:
        return Target(Path(text), None)
    file, _, cls = text.rpartition(":")
    if not cls.isidentifier():
        raise UsageError(f"{text}: expected FILE or FILE:CLASS, and {cls!r} is not a class name")
    return Target(Path(file), cls)


def _choices(path: Path, names: list[str]) -> str:
    return ", ".join(f"{path}:{n}" for n in names)


def resolve_class(target: Target) -> str:
    """The class to optimise: the one named, else the one marked, else KernelBench's `Model`."""
    path = target.path
    if path.is_dir():
        raise UsageError(f"{path} is a folder: name one file of it, or run `fusebot bench {path} --out DIR` to search "
                         "every problem file in it")
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        module = read_module(path.read_text(errors="replace"))
    except SyntaxError as e:
        raise UsageError(f"{path}:{e.lineno or 1}: syntax error: {e.msg}") from None
    classes = sorted(module.classes, key=module.classes.__getitem__)
    if target.class_name is not None:
        cls = target.class_name
        if cls not in module.classes:
            listed = f"; it defines {_choices(path, classes)}" if classes else "; it defines no class"
            raise UsageError(f"{path} defines no class {cls!r}{listed}")
    elif len(module.marked) > 1:
        raise UsageError(f"{path} marks {len(module.marked)} classes `{MARKER}`; name one: "
                         f"{_choices(path, module.marked)}")
    elif module.marked:
        cls = module.marked[0]
    elif KERNELBENCH_CLASS in module.classes:
        cls = KERNELBENCH_CLASS
    else:
        listed = f" (it defines {_choices(path, classes)})" if classes else ""
        raise UsageError(f"{path}: no class marked `{MARKER}` and no class {KERNELBENCH_CLASS!r}; "
                         f"name one as FILE:CLASS{listed}")
    if "get_inputs" not in module.functions:
        raise UsageError(f"{path}:{module.classes[cls]}: {cls} needs example inputs: define get_inputs() (and "
                         "get_init_inputs() for its constructor's arguments) at module level")
    return cls


def problem_for(text: str, **overrides) -> ProblemSpec:
    """The problem FILE[:CLASS] names. Raises UsageError naming the file (and line) and the fix."""
    target = parse_target(text)
    cls = resolve_class(target)
    from runner.pipeline import problem_from_file  # (torch: only once the file names a class)

    spec = problem_from_file(target.path, **overrides)
    if cls == KERNELBENCH_CLASS:
        return spec
    # named after its class, as a repository target is: two classes of one file are two searches
    return spec.model_copy(update={"class_name": cls, "name": cls})
