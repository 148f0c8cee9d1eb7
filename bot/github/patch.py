"""A `git apply`-able patch from file contents: pure (difflib), for fork PRs, which fusebot never pushes to."""

from __future__ import annotations

import difflib
import re


def _lines(text: str) -> list[str]:
    """The text's lines as git counts them: split at "\\n" only (str.splitlines also splits at "\\r", form feeds
    and other separators, which git keeps inside a line: a patch cut there is corrupt)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def unified_patch(old: dict[str, str | None], new: dict[str, str | None]) -> str:
    """The patch turning `old` into `new` (path -> text; None or absent: no such file), files in path order."""
    out: list[str] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        a_lines = [] if a is None else _lines(a)
        b_lines = [] if b is None else _lines(b)
        out.append(f"diff --git a/{path} b/{path}\n")
        if a is None:
            out.append("new file mode 100644\n")
        elif b is None:
            out.append("deleted file mode 100644\n")
        if not a_lines and not b_lines:
            continue  # an empty file created or deleted: the header says it all
        body = difflib.unified_diff(a_lines, b_lines, "/dev/null" if a is None else f"a/{path}",
                                    "/dev/null" if b is None else f"b/{path}", n=3)
        for line in body:
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def file_sections(patch: str) -> list[str]:
    """`patch` cut before each `diff --git` line: one section per file, each a patch of its own."""
    starts = [m.start() for m in re.finditer(r"^diff --git ", patch, re.M)] or [0]
    if starts[0] != 0:
        starts.insert(0, 0)
    return [patch[a:b] for a, b in zip(starts, [*starts[1:], len(patch)], strict=True) if patch[a:b]]


def split_patch(patch: str, room: int, first_room: int | None = None) -> tuple[list[str], list[str]]:
    """`patch` packed into parts of whole files (each part applies by itself with `git apply`, in any order): the
    first of at most `first_room` characters (`room` when None; it may stay empty), the others of at most `room`;
    and the sections of the files too large for any part."""
    parts = [""]
    too_large: list[str] = []
    for section in file_sections(patch):
        if len(section) > room:
            too_large.append(section)
        elif len(parts[-1]) + len(section) <= (room if len(parts) > 1 or first_room is None else first_room):
            parts[-1] += section
        else:
            parts.append(section)
    return parts, too_large
