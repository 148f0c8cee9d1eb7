"""What the typer shells (`fusebot eval`, `optimize`, `bench`) share, so that they read like the tools their users
live in (pytest, ruff, gh): `-h` beside `--help`; plain help whose usage line says `[OPTIONS] REFERENCE CANDIDATE`
and whose flags carry no type tag; the result on stdout and diagnostics on stderr, one unwrapped line each off a
terminal (so `file:line:` stays whole for editors and grep); logging drawn by rich only on a terminal; and the
backend checked before any work starts.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from typer.core import TyperArgument, TyperCommand

from runner.contract import EXIT_STATUS
from runner.errors import ProblemError, UsageError

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
BACKENDS = ("cuda", "cpu")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Command(TyperCommand):
    """A typer command with click's plain conventions: the usage line names arguments as their capital metavars
    (typer writes a required one as `{reference}`), and the arguments' list shows no `<path>` type tag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument):
                param.display_type_rich = _no_type  # type: ignore[method-assign]

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in super().collect_usage_pieces(ctx)]


def _no_type(ctx: Any) -> None:
    return None


def app(help_text: str) -> typer.Typer:
    """A one-command Typer app with plain help (`rich_markup_mode=None`): click's layout, no boxes, no type tags."""
    return typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                       rich_markup_mode=None, context_settings=CONTEXT, help=help_text)


def exit_status_help(statuses: dict[int, str] = EXIT_STATUS) -> str:
    """The `Exit status:` block of a help page (kept as written: click's `\\b`), from the one table every command
    exits by (runner/errors.py; docs/exit-status.md repeats it)."""
    return "\b\nExit status:\n" + "\n".join(f"  {int(code):<3}  {meaning}" for code, meaning in statuses.items()) \
        + "\n"


# What failed, in the user's words, by the stage of runner.harness that ran their code.
STAGE_WORDS = {
    "import": "your module failed to import",
    "init inputs": "get_init_inputs() failed",
    "inputs": "get_inputs() failed",
    "second inputs": "get_second_inputs() failed",
    "init": "your module's constructor failed",
    "reference": "your module's forward failed",
}


def user_path(where: str, typed: Path | None = None) -> str:
    """`file[:line]` as the user knows it: the path as they typed it where it is their problem's file, else relative
    to the working directory where it lies under it, else as it is."""
    m = re.fullmatch(r"(.*?)(:\d+)?", where)
    file, line = (m.group(1), m.group(2) or "") if m else (where, "")
    path = Path(file)
    if not path.is_absolute():
        return where
    if typed is not None and path.resolve() == typed.resolve():
        return f"{typed}{line}"
    try:
        return f"{path.resolve().relative_to(Path.cwd().resolve())}{line}"
    except ValueError:
        return where


def problem_message(exc: ProblemError, typed: Path | None = None) -> str:
    """A broken problem as the user's own mistake, at their file and line: `models/x.py:11: your module's forward
    failed: RuntimeError: ...`; no word of the harness's (judge, baselines)."""
    words = STAGE_WORDS.get(exc.stage)
    return f"{user_path(exc.where, typed)}: " + (f"{words}: " if words else "") + exc.cause


def stderr_console() -> Console:
    """Diagnostics. Off a terminal rich neither wraps (soft_wrap) nor styles."""
    return Console(stderr=True, soft_wrap=True, highlight=False)


def stdout_console() -> Console:
    """The result: tables and summary lines."""
    return Console(soft_wrap=True, highlight=False)


def setup_logging(verbose: bool, console: Console) -> None:
    """INFO with -v, else WARNING; drawn by rich on a terminal (beside a live progress line), plain lines elsewhere."""
    level = logging.INFO if verbose else logging.WARNING
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=False, markup=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def error(message: str) -> None:
    """One diagnostic on stderr, `error: ...`, never wrapped; red on a terminal."""
    typer.echo(typer.style("error", fg="red", bold=True) + ": " + message, err=True)


def fail(message: str, code: int) -> typer.Exit:
    """Print `message`'s first line as an error; the rest (a worker's traceback) goes to the log at INFO, shown with
    -v. The caller raises the returned Exit (`raise fail(...) from None`)."""
    head, _, details = message.strip().partition("\n")
    log = logging.getLogger(__name__)
    if details and not log.isEnabledFor(logging.INFO):
        head += " (-v shows the details)"
    error(head)
    if details:
        log.info("details:\n%s", details)
    return typer.Exit(code)


def exit_now(code: int = 0) -> None:
    """End a command that imported torch at once, its output flushed and its work closed: the interpreter's own
    finalization after `import torch` took 3.6 s on 2 loaded CPU cores (load 8), more than a 30 s budget's tolerance.
    As a program only: inside an in-process invocation (a test's CliRunner, whose streams replace sys.stdout and
    sys.stderr) it returns, and the caller ends as usual."""
    if sys.stdout is not sys.__stdout__ or sys.stderr is not sys.__stderr__:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def torch_has_cuda() -> bool:
    import torch  # (the shells import torch when a command runs, never for its help or a usage error)

    return torch.version.cuda is not None


def choose_backend(backend: str | None) -> str:
    """The backend asked for, or cuda where a GPU is present. Raises UsageError when cuda is asked of a torch built
    without it (a CPU wheel): no harness process is started to find that out."""
    if backend is not None and backend not in BACKENDS:
        raise UsageError(f"--backend {backend}: expected cuda or cpu")
    import torch

    from runner.harness.evaluator import default_backend  # torch: when a command runs, not for --help

    chosen = backend or default_backend()
    if chosen == "cuda" and not torch_has_cuda():
        raise UsageError(f"--backend cuda: this torch has no CUDA (torch {torch.__version__})")
    return chosen
