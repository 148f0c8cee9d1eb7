"""torch.compile's cache for the judge: one per reference, keyed by every file the judge may read of it.

The reference is the user's code and runs in the judge, which writes torch.compile's cache (compiled graphs,
generated kernels, inductor's precompiled C++ header: code that a judge loading them runs). A cache shared by every
judge is one a hostile reference plants code in for the judges of other problems. A judge gets, read-write, only the
folder keyed by its own problem: the problem's fields and the contents of every file it is granted (its `path`, or
every file under its `root` but `.git`), with the device. What a reference leaves there is loaded only by a judge that
runs the very same files, which could write it itself; the next judge of the same module starts warm. A problem whose
files exceed MAX_KEYED_BYTES or MAX_KEYED_FILES gets a private cache in its evaluation's directory instead (cold, gone
with it).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from runner.contract import ProblemSpec

MAX_KEYED_BYTES = 64 << 20
MAX_KEYED_FILES = 20_000


def _files(spec: ProblemSpec) -> list[Path] | None:
    """The files the judge is granted of the problem, sorted; None where there are more than the caps allow."""
    found: list[Path] = []
    if spec.path:
        found.append(Path(spec.path).absolute())
    if spec.root:
        for top, dirs, names in os.walk(Path(spec.root).absolute()):
            dirs[:] = sorted(d for d in dirs if d != ".git")
            found += [Path(top) / n for n in sorted(names)]
            if len(found) > MAX_KEYED_FILES:
                return None
    return found


def key(spec: ProblemSpec, device: str) -> str | None:
    """The cache's key for a judge of `spec` on `device`, or None where its files are over the caps."""
    files = _files(spec)
    if files is None:
        return None
    h = hashlib.sha256(spec.model_dump_json().encode() + b"\0" + device.encode())
    total = 0
    for f in files:
        h.update(b"\0" + str(f).encode() + b"\0")
        try:
            if f.is_symlink() or not f.is_file():
                h.update(b"not a regular file")
                continue
            total += f.stat().st_size
            if total > MAX_KEYED_BYTES:
                return None
            h.update(f.read_bytes())
        except OSError:
            h.update(b"unreadable")
    return h.hexdigest()[:32]


def judge_env(env: dict[str, str], cache_dir: Path, spec: ProblemSpec, device: str) -> dict[str, str]:
    """`env` (a judge's, its caches in its own directory) with torch.compile's and Triton's caches in the folder keyed
    by its problem, where it has one (the process layer grants a cache folder outside the child's directory
    read-write: runner.harness.procs.process)."""
    k = key(spec, device)
    if k is None:
        return env
    folder = cache_dir / "inductor" / k
    (folder / "triton").mkdir(parents=True, exist_ok=True)
    return {**env, "TORCHINDUCTOR_CACHE_DIR": str(folder), "TRITON_CACHE_DIR": str(folder / "triton")}
