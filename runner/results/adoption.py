"""The edit a kernel PR makes to the marked class's own file, so that merging the PR adopts the drop-in.

    text = adopted(module_text, "RowGain", "fusebot_kernels/row_gain")     # pure: the file's new text, or None

The lines go at the end of the file, below the class (and the factories beside it): they import `adopt` from the
drop-in and bind the class's name to what it answers, the drop-in's subclass. The drop-in imports this module for the
original class: `adopt` is defined before that import, so either module may be imported first and each sees the
other's names (runner/shipped/dropin/adopt.py). FUSEBOT_DISABLE, read when the module is imported, keeps the
original class, as does a copy of the module whose kernels folder is not importable (a package installed without it:
only a ModuleNotFoundError naming that folder or the drop-in is caught); deleting the lines undoes the change. No edit
where the drop-in is not importable as a package (a kernels directory whose folders are not identifiers) or the class
is not defined at the file's top level.

A file with several marked classes: a PR is about one target, so its edit adopts that class only. Another target's
edit, made on the file as the first left it, adds its own lines below the first's and keeps them (each block binds
its own class's name, its import just above its use); an edit made again changes nothing. One PR of several targets
of a file holds each one's lines (bot/publish/propose.py puts the edits together).
"""

from __future__ import annotations

import ast

MARK = "# ---- fusebot:"


def dropin_module(kernels_path: str) -> str | None:
    """`fusebot_kernels.row_gain.dropin` for the folder `fusebot_kernels/row_gain`, or None where a folder's name is
    not an identifier (the folder is not importable as a package)."""
    parts = [p for p in kernels_path.strip("/").split("/") if p]
    return ".".join([*parts, "dropin"]) if parts and all(p.isidentifier() for p in parts) else None


def block(class_name: str, kernels_path: str) -> str | None:
    """The lines appended to the module's file, or None where the drop-in is not importable."""
    module = dropin_module(kernels_path)
    if module is None:
        return None
    folder = kernels_path.strip("/")
    parts = module.split(".")
    missing = tuple(".".join(parts[:n]) for n in range(1, len(parts) + 1))  # the packages that may be absent
    return (f"{MARK} {class_name} runs the fused kernel in {folder}/ for the calls it was verified for\n"
            f"# ({folder}/BENCHMARK.md) and its original forward for every other call. FUSEBOT_DISABLE=1 keeps the\n"
            "# class above, as does a copy of this module without the kernels folder (an installed package); deleting\n"
            "# these lines undoes the change. The import stays below the class: the drop-in imports this module.\n"
            "try:\n"
            f"    from {module} import adopt as _fusebot_adopt  # noqa: E402  # isort: skip\n"
            "except ModuleNotFoundError as _fusebot_missing:\n"
            f"    if _fusebot_missing.name not in {missing!r}:\n"
            "        raise\n\n"
            "    def _fusebot_adopt(cls):\n"
            "        return cls\n\n\n"
            f"{class_name} = _fusebot_adopt({class_name})\n")


def adopted(text: str, class_name: str, kernels_path: str) -> str | None:
    """The module's text with the adoption lines at its end (unchanged where it has them already), or None: no edit
    (the class is not defined at the top level of a file that parses, or the drop-in is not importable)."""
    lines = block(class_name, kernels_path)
    if lines is None or not defines(text, class_name):
        return None
    if lines in text:
        return text
    return text.rstrip("\n") + "\n\n\n" + lines


def defines(text: str, class_name: str) -> bool:
    """Whether `text` parses and defines `class_name` at its top level."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.ClassDef) and n.name == class_name for n in tree.body)
