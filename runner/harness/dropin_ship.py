"""What a PR ships beside its drop-in, so the serving host needs nothing but torch (no compiler, no writable shared
/tmp), made by the runner for the arch it measured on, confined like every build, and written as text (a PR's files
are text).

A CUDA kernel ships device code only (`shipped_device_code`): its cubin (`kernel.<arch>.cubin.b64`), the PTX for later
GPUs and the launch plans its host code made at the verified calls (runner/harness/launch_plan.py), run through the
CUDA driver (runner/shipped/dropin/device.py). Where those cannot be made (a launcher whose steps a plan cannot hold),
no binary ships: the drop-in builds kernel.cu where nvcc is present and otherwise runs the original forward, and the
PR says why. A C++ kernel is host code: its library ships (`shipped_library`, for this CPU's x86-64 level),
`kernel.<arch>.so.b64`, zlib-compressed and base64-encoded under one comment line; the drop-in records its sha256 and
refuses a library whose bytes do not have it (runner/shipped/dropin/runtime.py).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from runner.contract import Candidate
from runner.errors import MachineError
from runner.harness import build, launch_plan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShippedLibrary:
    arch: str  # "sm_90", "x86-64-v3", "aarch64"
    name: str  # the file beside the drop-in
    sha256: str  # of the library's bytes (not of the text)
    text: str


def library_filename(arch: str) -> str:
    return f"kernel.{arch}.so.b64"


def current_arch(backend: str) -> str | None:
    """The arch a library built here is for: this GPU's compute capability, or this CPU's level; None without a GPU
    for a CUDA kernel."""
    if backend == "cuda":
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return build.cpu_level()


def encode(arch: str, data: bytes, note: str = "") -> ShippedLibrary:
    digest = hashlib.sha256(data).hexdigest()
    b64 = base64.b64encode(zlib.compress(data, 9)).decode()
    body = "\n".join(b64[i:i + 76] for i in range(0, len(b64), 76))
    head = (f"# fusebot kernel library for {arch}{f' ({note})' if note else ''}: zlib-compressed, base64. "
            f"sha256 of the library: {digest}\n")
    return ShippedLibrary(arch, library_filename(arch), digest, head + body + "\n")


def decode(text: str) -> bytes:
    return zlib.decompress(base64.b64decode("".join(ln for ln in text.splitlines() if not ln.startswith("#"))))


def shipped_library(candidate: Candidate, *, cache_dir: Path | None = None) -> ShippedLibrary | None:
    """The shippable library of `candidate` for this host's arch, or None (logged) where it cannot be built here: the
    drop-in then builds from source on a host with a compiler."""
    arch = current_arch(candidate.backend)
    if arch is None:
        log.info("%s: no GPU here to build a shippable CUDA library for; the drop-in ships without one", candidate.id)
        return None
    try:
        tc = build.shippable_toolchain(candidate.backend, arch)
        out = build.build(candidate, cuda_arch=arch, cache_dir=cache_dir, tc=tc)
    except (MachineError, OSError) as exc:
        log.warning("%s: the shippable library was not built (%s); the drop-in ships without one", candidate.id, exc)
        return None
    if not out.info.ok or out.library is None:
        log.warning("%s: the shippable library failed to build; the drop-in ships without one: %s", candidate.id,
                    out.info.log[-1000:])
        return None
    flags = " ".join(f for f in tc.flags if f.startswith(("-march", "-gencode", "-cudart")) or f == "static")
    return encode(arch, out.library.read_bytes(), f"{tc.compiler}, {flags}")


@dataclass(frozen=True)
class DeviceCode:
    """What a CUDA drop-in ships in place of a host library: the cubin of the verified arch (base64 text), the PTX for
    later GPUs, and the launch plans of the verified calls."""

    arch: str
    files: dict[str, str]  # file name -> text
    code: dict[str, tuple[str, str]]  # "sm_90" / "compute_90" -> (file name, sha256 of its bytes)
    plans: list[dict]


def encode_cubin(arch: str, data: bytes) -> str:
    b64 = base64.b64encode(data).decode()
    body = "\n".join(b64[i:i + 76] for i in range(0, len(b64), 76))
    return (f"# fusebot cubin for {arch}, base64; made by: {' '.join(launch_plan.cubin_command(arch))}. sha256 of "
            f"the cubin: {hashlib.sha256(data).hexdigest()}\n{body}\n")


def decode_cubin(text: str) -> bytes:
    return base64.b64decode("".join(ln for ln in text.splitlines() if not ln.startswith("#")))


def shipped_device_code(source: str, calls: list[dict], arch: str | None = None) -> DeviceCode | str:
    """The device code of a fast-format CUDA kernel for `arch` (this GPU's by default) and its plans at `calls`
    (runner.harness.launch_plan.record: the kernel's host code, the catalog's or its author's, run once per verified
    call with the recorder), or why it cannot be made here (logged): no GPU arch, no verified call, or host code that
    does something a plan cannot hold. Nothing else ships then: no host binary."""
    arch = arch or current_arch("cuda")
    if arch is None:
        return "no GPU on the runner to make device code for"
    if not calls:
        return "no verified call to record a launch plan at"
    return _device_code(source, json.dumps(calls, sort_keys=True), arch)


@functools.lru_cache(maxsize=16)  # a result's files are made twice (before and after its check): one build
def _device_code(source: str, calls_json: str, arch: str) -> DeviceCode | str:
    calls = json.loads(calls_json)
    try:
        with tempfile.TemporaryDirectory(prefix="fusebot-device-") as tmp:
            cubin, ptx = launch_plan.device_code(source, arch, Path(tmp))
            plans = launch_plan.record(source, arch, calls, Path(tmp), cubin=cubin)
    except (launch_plan.PlanError, MachineError, OSError, subprocess.SubprocessError) as exc:
        log.warning("the device code was not made (%s); the drop-in ships no binary", exc)
        return f"its host code cannot be written down as launch plans ({_first_line(exc)})"
    virt = "compute_" + arch.removeprefix("sm_")
    cubin_name, ptx_name = launch_plan.cubin_filename(arch), launch_plan.ptx_filename(arch)
    return DeviceCode(arch, {cubin_name: encode_cubin(arch, cubin), ptx_name: ptx},
                      {arch: (cubin_name, hashlib.sha256(cubin).hexdigest()),
                       virt: (ptx_name, hashlib.sha256(ptx.encode()).hexdigest())}, plans)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n", 1)[0].split())
    return text[:300] or type(exc).__name__
