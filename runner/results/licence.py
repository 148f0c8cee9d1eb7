"""The SPDX licence line on every file a PR adds: the target repository's licence where it declares one, else
`NOASSERTION` (SPDX's word for "not stated"; the PR says so).

    spdx, source = repo_licence(root)                     # ("MIT", "LICENSE"), or ("NOASSERTION", "")
    files = with_spdx(files, spdx)                        # pure: a comment line in each file's own syntax

Declared means: an `SPDX-License-Identifier:` line in the licence file, pyproject.toml's `license` (a PEP 639 SPDX
expression, or `{text = "..."}` naming one), or a licence file whose text is one of the common licences, recognised
by phrases each has and no other does. Anything else (a GPL whose "or later" is not stated, a licence of its own) is
`NOASSERTION`: a guess would be a claim on the user's behalf.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

NOASSERTION = "NOASSERTION"
FUSEBOT_LICENCE = "MIT"  # fusebot's own, for the file it copies unchanged (fusebot.h)
LICENCE_FILES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "LICENCE", "LICENCE.md", "COPYING")
_SPDX = re.compile(r"SPDX-License-Identifier:\s*([A-Za-z0-9.+()\- ]+?)\s*(?:\*/|-->|$)", re.M)
_ID = re.compile(r"^[A-Za-z0-9.+\-]+( (AND|OR|WITH) [A-Za-z0-9.+\-]+)*$")
# (SPDX id, phrases its text has, all of them), most specific first
_TEXTS = (("Apache-2.0", ("apache license", "version 2.0")),
          ("MIT", ("permission is hereby granted, free of charge", "the above copyright notice")),
          ("BSD-3-Clause", ("redistribution and use in source and binary forms", "neither the name")),
          ("BSD-2-Clause", ("redistribution and use in source and binary forms",)),
          ("MPL-2.0", ("mozilla public license", "version 2.0")),
          ("Unlicense", ("this is free and unencumbered software released into the public domain",)))
_NOT_BSD2 = ("neither the name", "advertising materials")


def repo_licence(root: Path) -> tuple[str, str]:
    """(the SPDX id the repository at `root` declares, the file that says it), or (NOASSERTION, "")."""
    for name in LICENCE_FILES:
        path = root / name
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        m = _SPDX.search(text)
        if m and _ID.match(m.group(1).strip()):
            return m.group(1).strip(), name
        found = _recognise(text)
        if found:
            return found, name
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            lic = tomllib.loads(pyproject.read_text()).get("project", {}).get("license")
        except (tomllib.TOMLDecodeError, OSError):
            lic = None
        if isinstance(lic, dict):
            lic = lic.get("text")
        if isinstance(lic, str) and _ID.match(lic.strip()):
            return lic.strip(), "pyproject.toml"
    return NOASSERTION, ""


def _recognise(text: str) -> str | None:
    low = " ".join(text.lower().split())
    for spdx, phrases in _TEXTS:
        if all(p in low for p in phrases):
            if spdx == "BSD-2-Clause" and any(p in low for p in _NOT_BSD2):
                continue
            return spdx
    return None


def spdx_line(spdx: str, name: str) -> str:
    """The licence line for a file named `name`, in its own comment syntax ("" for a file that has none: JSON)."""
    text = f"SPDX-License-Identifier: {spdx}"
    if name.endswith((".py", ".b64")):
        return f"# {text}\n"
    if name.endswith((".cu", ".cpp", ".h", ".ptx")):
        return f"// {text}\n"
    if name.endswith(".md"):
        return f"<!-- {text} -->\n"
    return ""


def with_spdx(files: dict[str, str], spdx: str, *, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file with its licence line first (fusebot.h with fusebot's own licence); keys in `skip` (a repository
    file a rewrite changes: the user's own) and files without a comment syntax unchanged. Pure."""
    out = {}
    for path, text in files.items():
        name = path.rsplit("/", 1)[-1]
        lic = FUSEBOT_LICENCE if name == "fusebot.h" else spdx
        line = "" if path in skip or path.startswith("/") else spdx_line(lic, name)
        out[path] = line + text if line and not text.startswith(line) else text
    return out


def licence_note(spdx: str, source: str) -> str:
    """The sentence BENCHMARK.md ends with: which licence the added files carry, and why."""
    if spdx == NOASSERTION:
        return (f"Licence: the files fusebot added carry `SPDX-License-Identifier: {NOASSERTION}`: the repository "
                "declares no licence fusebot recognises (a LICENSE file or pyproject.toml's `license`).")
    return f"Licence: the files fusebot added carry `SPDX-License-Identifier: {spdx}`, as {source} declares."
