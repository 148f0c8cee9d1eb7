"""Minimal text edits of a module file: a changed expression's text is `ast.unparse` of the new expression (in
parentheses only where its context needs them, in the file's own quotes, one argument a line where a call would
make its line too long), a statement alone on its lines is deleted with them, and every other byte of the file is
kept. Edits whose result does not parse back to exactly the intended tree are refused.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """Replace the expression at `at` (lineno, col, end_lineno, end_col) with `new`, or delete the statement there."""

    at: tuple[int, int, int, int]
    new: ast.expr | None = None

    @classmethod
    def of(cls, node: ast.AST, new: ast.expr | None = None) -> Edit:
        return cls((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset), new)


def _pos(node: ast.AST) -> tuple[int, int, int, int] | None:
    if not hasattr(node, "end_col_offset") or node.end_col_offset is None:
        return None
    return node.lineno, node.col_offset, node.end_lineno, node.end_col_offset


class _Swap(ast.NodeTransformer):
    def __init__(self, edits: dict[tuple, Edit]):
        self.edits = edits

    def visit(self, node):
        e = self.edits.get(_pos(node))
        if e is not None and (e.new is not None) == isinstance(node, ast.expr):
            return e.new if e.new is not None else None
        return self.generic_visit(node)


def _offset(lines: list[str], line: int, col: int) -> int:
    """Character offset in the text of (1-based line, UTF-8 byte column), as ast gives them."""
    return sum(len(x) for x in lines[: line - 1]) + len(lines[line - 1].encode()[:col].decode())


def apply(text: str, edits: list[Edit]) -> str | None:
    """The text with the edits made, or None when they overlap or the result is not the intended tree."""
    lines = text.splitlines(keepends=True)
    spans = []
    for e in edits:
        a, b = _offset(lines, e.at[0], e.at[1]), _offset(lines, e.at[2], e.at[3])
        if e.new is None:  # a statement alone on its lines: the lines go
            start = _offset(lines, e.at[0], 0)
            end = _offset(lines, e.at[2] + 1, 0) if e.at[2] < len(lines) else len(text)
            rest = text[b:end].strip()
            if text[start:a].strip() or (rest and not rest.startswith("#")):
                return None
            spans.append((start, end, None))
        else:
            spans.append((a, b, e.new))
    spans.sort(key=lambda s: s[0])
    if any(x[1] > y[0] for x, y in zip(spans, spans[1:], strict=False)):
        return None
    # parentheses only where the context needs them: each replacement is tried bare, alone, against its own tree
    pieces = []
    for start, end, new in spans:
        body = "" if new is None else _wrapped(text, start, end, _quoted_like(text, ast.unparse(new)))
        if new is not None:
            alone = ast.dump(_Swap({e.at: e for e in edits if e.new is new}).visit(ast.parse(text)))
            if not _atomic(new) and _dump(text[:start] + body + text[end:]) != alone:
                body = f"({body})"
            elif _atomic(new) and text[start - 1: start] == "(" and text[end: end + 1] == ")" and \
                    _dump(text[: start - 1] + body + text[end + 1:]) == alone:
                start, end = start - 1, end + 1  # `(attn @ v).sum()` -> `F.f(...).sum()`: its parentheses go too
        pieces.append((start, end, body))
    out = text
    for start, end, body in reversed(pieces):
        out = out[:start] + body + out[end:]
    return out if _dump(out) == ast.dump(_Swap({e.at: e for e in edits}).visit(ast.parse(text))) else None


def _dump(text: str) -> str | None:
    try:
        return ast.dump(ast.parse(text))
    except SyntaxError:
        return None


def _atomic(node: ast.expr) -> bool:
    return isinstance(node, ast.Call | ast.Name | ast.Attribute | ast.Subscript | ast.Constant)


def _quoted_like(text: str, expr: str) -> str:
    """ast.unparse quotes strings with '; a file that quotes with " gets its own style for plain words."""
    if text.count('"') >= text.count("'"):
        return re.sub(r"'(\w*)'", r'"\1"', expr)
    return expr


LINE_CHARS = 120


def _wrapped(text: str, start: int, end: int, expr: str) -> str:
    """A call that would make its line longer than LINE_CHARS, one argument a line (the statement's indent + 4)."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line = text[line_start:start] + expr + text[end: line_end if line_end >= 0 else len(text)]
    if len(line) <= LINE_CHARS:
        return expr
    try:
        call = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return expr
    if not isinstance(call, ast.Call) or not call.args + call.keywords:
        return expr
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    args = [ast.unparse(a) for a in call.args] + [
        f"{k.arg}={ast.unparse(k.value)}" if k.arg else f"**{ast.unparse(k.value)}" for k in call.keywords]
    inner = "".join(f"\n{indent}{_quoted_like(text, a)}," for a in args)
    return f"{_quoted_like(text, ast.unparse(call.func))}({inner}\n{indent[:-4]})"
