"""Ideas and code out of free-form model answers. Pure functions; a miss is None or [], never an exception."""

from __future__ import annotations

import json
import re

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)

# Fence tags that can hold each kind of source; an untagged fence is accepted for both.
_LANGS = {
    "fast": {"", "c", "cpp", "c++", "cxx", "cc", "cu", "cuda", "h", "hpp"},
    "kernelbench": {"", "python", "py", "python3"},
}
# What a usable source must define.
REQUIRED = {"fast": "fusebot_forward", "kernelbench": "ModelNew"}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block as (tag, body); an unterminated last fence runs to the end (a cut-off answer)."""
    return [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(text)]


def extract_code(text: str, fmt: str) -> tuple[str | None, str]:
    """The largest fenced block of the right language that defines what `fmt` requires.

    Returns (code, "") or (None, why). `fmt` is "fast" (C/C++/CUDA exporting fusebot_forward) or "kernelbench"
    (Python defining ModelNew).
    """
    blocks = code_blocks(text)
    if not blocks:
        return None, "no fenced code block in the answer"
    need = REQUIRED[fmt]
    fitting = [body for tag, body in blocks if tag in _LANGS[fmt] and need in body]
    if not fitting:
        tags = ", ".join(sorted({t or "untagged" for t, _ in blocks}))
        return None, f"no code block defines {need} (found {len(blocks)} block(s): {tags})"
    code = max(fitting, key=len).strip("\n") + "\n"
    if fmt == "fast" and code.count("{") != code.count("}"):
        return None, "the code block is cut off (unbalanced braces)"
    return code, ""


_NUMBERED = re.compile(r"^\s{0,3}(?:#+\s*)?(?:\*\*)?(?:idea\s*)?(\d{1,2})\s*[.):\-]\s*(?:\*\*)?\s*(.*)$", re.I)
_BULLET = re.compile(r"^\s{0,3}[-*\u2022+]\s+(.*)$")


def _clean(s: str) -> str:
    s = re.sub(r"\*\*|__|`", "", s)
    return re.sub(r"\s+", " ", s).strip(" :-")


def _items(lines: list[str], pattern: re.Pattern, group: int) -> list[str]:
    """Items starting at lines matching `pattern`, with their continuation lines: the lines right below, or indented
    ones after a blank line. An unindented line after a blank line ends the item."""
    items: list[list[str]] = []
    in_item = after_blank = False
    for line in lines:
        if m := pattern.match(line):
            items.append([m.group(group)])
            in_item = True
        elif not line.strip():
            after_blank = True
            continue
        elif in_item and (not after_blank or line[:1].isspace()):
            items[-1].append(line)
        else:
            in_item = False
        after_blank = False
    return [_clean(" ".join(i)) for i in items]


def _from_json(text: str) -> list[str] | None:
    candidates = [body for tag, body in code_blocks(text) if tag in ("json", "")] + [text]
    for c in candidates:
        start = min((i for i in (c.find("["), c.find("{")) if i >= 0), default=-1)
        if start < 0:
            continue
        try:
            data = json.JSONDecoder().raw_decode(c[start:])[0]
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            data = next((v for v in data.values() if isinstance(v, list)), None)
        if isinstance(data, list):
            out = []
            for x in data:
                if isinstance(x, dict):
                    x = x.get("idea") or x.get("text") or x.get("description") or " ".join(map(str, x.values()))
                out.append(_clean(str(x)))
            return out
    return None


def extract_ideas(text: str, n: int) -> list[str]:
    """Up to n ideas from an answer written as JSON, a numbered list, bullets, or paragraphs (in that order)."""
    outside = _FENCE.sub("", text)
    lines = outside.splitlines()
    for found in (_from_json(text), _items(lines, _NUMBERED, 2), _items(lines, _BULLET, 1)):
        found = [i for i in (found or []) if len(i) >= 8]
        if found:
            return found[:n]
    paragraphs = [_clean(p) for p in re.split(r"\n\s*\n", outside)]
    return [p for p in paragraphs if len(p) >= 20][:n]
