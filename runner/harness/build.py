"""Building fast-format candidates: pure CUDA-C (nvcc) or C++ (the system compiler) into a shared library.

No torch headers, so a build takes about a second instead of a minute. Builds run in parallel on all cores, each
compiler under bubblewrap (runner.harness.bwrap: it sees the toolchain and its own temporary directory, writes only
there, and its whole tree is killed on timeout); its log is scrubbed of credentials and outside paths. Builds are
cached by a hash of the sources, the flags, the compiler's version and the target architecture.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runner.contract import BuildInfo, Candidate
from runner.errors import MachineError
from runner.harness import bwrap, ptxas
from runner.harness.sandbox import confined_env
from runner.harness.scrub import scrub

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parents[1] / "csrc"
LIB_NAME = "libcandidate.so"
RESOURCES_NAME = "kernels.json"  # beside the library in the cache: what ptxas reported of its kernels


class CompilerMissing(MachineError):
    """The machine lacks the compiler a backend needs (a broken machine, not a bad candidate)."""


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    version: str
    target: str  # "sm_90" for CUDA, the host CPU model for C++
    flags: tuple[str, ...]


# Each compiler process's address space: cc1plus fed `#include "/dev/zero"` grew to 2 GB resident asking for 4 GiB.
BUILD_MEMORY_BYTES = 4 << 30


def default_cache_dir() -> Path:
    return Path(os.environ.get("FUSEBOT_CACHE_DIR") or Path.home() / ".cache" / "fusebot") / "build"


@functools.cache
def _version(compiler: str) -> str:
    exe = shutil.which(compiler)
    if exe is None:
        raise CompilerMissing(f"{compiler} not found on PATH")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


# The C++ backend's flags, also written into a drop-in (runner/harness/dropin.py), an epilogue candidate's own build
# (runner/catalog/epilogue.py) and the LLM's prompt. -fno-trapping-math: with the default, g++ 12 on an AVX2 machine
# (an AMD EPYC, znver3) kept a select such as relu's `t > 0 ? t : 0` as a branch and the loop scalar (1M floats:
# 2.8 ms on 2 threads against 0.18 vectorized, and eager's 1.1-1.4); AVX-512 targets vectorized it either way. It
# changes no value, only whether a comparison may raise a floating-point exception flag that nothing reads.
CPU_FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-std=c++17", "-shared", "-fPIC", "-fopenmp")
CUDA_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC")  # and -gencode for the target


def toolchain(backend: str, cuda_arch: str | None = None) -> Toolchain:
    if backend == "cuda":
        arch = cuda_arch or "sm_90"
        num = arch.removeprefix("sm_")
        # (ptxas's report of each kernel's registers, spills and shared memory: runner/harness/ptxas.py)
        flags = (*CUDA_FLAGS, f"-gencode=arch=compute_{num},code={arch}", ptxas.PTXAS_VERBOSE)
        return Toolchain("nvcc", _version("nvcc"), arch, flags)
    cxx = os.environ.get("CXX", "g++")
    return Toolchain(cxx, _version(cxx), _cpu_model(), CPU_FLAGS)


# x86-64 micro-architecture levels (the psABI's), highest first, by the /proc/cpuinfo flags each adds to the last.
X86_LEVELS = (("x86-64-v4", frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
              ("x86-64-v3", frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})),
              ("x86-64-v2", frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})))


@functools.cache
def cpu_level() -> str:
    """This CPU as a shipped library names it: the highest x86-64 level it has all of, or the machine (aarch64)."""
    machine = os.uname().machine
    if machine != "x86_64":
        return machine
    have: set[str] = set()
    try:
        have = next((set(line.split(":", 1)[1].split()) for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")), set())
    except OSError:
        pass
    level = "x86-64"
    for name, need in reversed(X86_LEVELS):
        if not need <= have:
            break
        level = name
    return level


def shippable_toolchain(backend: str, cuda_arch: str | None = None) -> Toolchain:
    """How the library a PR ships beside its drop-in is built: CUDA with the runtime linked statically and PTX beside
    the SASS (it needs only the driver's libcuda, and later GPUs run it through the driver's JIT); C++ for this CPU's
    x86-64 level instead of -march=native (the level is its name; a host with that level runs it)."""
    if backend == "cuda":
        arch = cuda_arch or "sm_90"
        num = arch.removeprefix("sm_")
        flags = (*CUDA_FLAGS, "-cudart", "static", f"-gencode=arch=compute_{num},code={arch}",
                 f"-gencode=arch=compute_{num},code=compute_{num}")
        return Toolchain("nvcc", _version("nvcc"), arch, flags)
    cxx, level = os.environ.get("CXX", "g++"), cpu_level()
    march = (f"-march={level}", "-mtune=native") if level.startswith("x86-64") else ()
    return Toolchain(cxx, _version(cxx), level, (*(f for f in CPU_FLAGS if f != "-march=native"), *march))


def cache_key(candidate: Candidate, tc: Toolchain) -> str:
    h = hashlib.sha256()
    for part in (tc.compiler, tc.version, tc.target, *tc.flags, *candidate.extra_cflags, (CSRC / "fusebot.h").read_text()):
        h.update(part.encode())
        h.update(b"\0")
    for name in sorted(candidate.sources):
        h.update(name.encode() + b"\0" + candidate.sources[name].encode() + b"\0")
    return h.hexdigest()[:32]


@dataclass
class BuildOutput:
    info: BuildInfo
    library: Path | None


def _sources_ok(candidate: Candidate) -> str | None:
    ext = ".cu" if candidate.backend == "cuda" else ".cpp"
    if not any(n.endswith(ext) for n in candidate.sources):
        return f"a {candidate.backend} fast-format candidate needs a {ext} source (got {sorted(candidate.sources)})"
    for name in candidate.sources:
        if "/" in name or name.startswith("."):
            return f"source name {name!r} must be a plain file name"
    return None


def build(candidate: Candidate, *, cuda_arch: str | None = None, cache_dir: Path | None = None,
          timeout_s: float = 300.0, tc: Toolchain | None = None, memory_bytes: int = BUILD_MEMORY_BYTES) -> BuildOutput:
    """Compile one fast-format candidate (with `tc`'s flags where given: shippable_toolchain). A compiler error is a
    BuildInfo with ok=False, never an exception. The compiler's address space is capped at `memory_bytes` (each of
    its processes: builds run one per core), besides the timeout."""
    start = time.monotonic()
    problem = _sources_ok(candidate)
    tc = tc or toolchain(candidate.backend, cuda_arch)
    if problem:
        return BuildOutput(BuildInfo(ok=False, seconds=0.0, log=problem, compiler=tc.compiler), None)
    cache = Path(cache_dir or default_cache_dir())
    key = cache_key(candidate, tc)
    final = cache / key / LIB_NAME
    resources = final.parent / RESOURCES_NAME
    if final.exists():
        kernels = json.loads(resources.read_text()) if resources.exists() else []
        return BuildOutput(BuildInfo(ok=True, seconds=time.monotonic() - start, cached=True, compiler=tc.compiler,
                                     kernels=kernels), final)
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"build-{key[:8]}-", dir=cache))
    try:
        for name, text in candidate.sources.items():
            (work / name).write_text(text)
        shutil.copy(CSRC / "fusebot.h", work / "fusebot.h")
        srcs = [n for n in candidate.sources if n.endswith((".cu", ".cpp", ".c"))]
        cmd = [tc.compiler, *tc.flags, *candidate.extra_cflags, "-I", str(work), "-o", LIB_NAME, *srcs]
        env = confined_env(work)
        try:
            done, text = _run_confined(cmd, work, env, timeout_s, memory_bytes)
        except subprocess.TimeoutExpired:
            return BuildOutput(BuildInfo(ok=False, seconds=time.monotonic() - start,
                                         log=f"build timed out after {timeout_s:.0f} s", compiler=tc.compiler), None)
        if done.returncode != 0 or not (work / LIB_NAME).exists():
            cap = (f"\n(the compiler's address space is capped at {memory_bytes / 2**30:.1f} GiB)"
                   if "memory" in text.lower() else "")
            return BuildOutput(BuildInfo(ok=False, seconds=time.monotonic() - start,
                                         log=scrub(text, job_dirs=[work], limit_chars=8000, keep="head") + cap,
                                         compiler=tc.compiler), None)
        final.parent.mkdir(parents=True, exist_ok=True)
        kernels = ptxas.parse(text)
        tmp_resources = final.parent / f".{RESOURCES_NAME}.{os.getpid()}"
        tmp_resources.write_text(json.dumps([k.model_dump() for k in kernels]))
        os.replace(tmp_resources, resources)  # before the library: a cache hit finds both
        tmp_final = final.parent / f".{LIB_NAME}.{os.getpid()}"
        shutil.copy(work / LIB_NAME, tmp_final)
        os.replace(tmp_final, final)  # atomic: a concurrent build of the same key lands the same bytes
        return BuildOutput(BuildInfo(ok=True, seconds=time.monotonic() - start, compiler=tc.compiler, kernels=kernels,
                                     log=scrub(ptxas.without_info(text), job_dirs=[work], limit_chars=4000)), final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_confined(cmd: list[str], work: Path, env: dict[str, str], timeout_s: float,
                  memory_bytes: int) -> tuple[subprocess.CompletedProcess, str]:
    """Run a compiler under bubblewrap (writes only in `work`), its address space capped at `memory_bytes`. On timeout
    its whole tree dies (cc1plus, ptxas...): the sandbox's PID namespace with bwrap, or the process group where the
    user opted out of the sandbox."""
    inner = [sys.executable, "-m", "runner.harness.sandbox", "--write", str(work), "--memory", str(memory_bytes),
             "--", *cmd]
    proc = bwrap.popen(bwrap.wrap(inner, work), cwd=work, env=env, stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        bwrap.kill_tree(proc.pid)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode), out.decode(errors="replace")


def build_many(candidates: list[Candidate], *, cuda_arch: str | None = None, cache_dir: Path | None = None,
               jobs: int | None = None, timeout_s: float = 300.0) -> dict[str, BuildOutput]:
    """Build every fast-format candidate in parallel (one compiler per core). Keyed by candidate id."""
    fast = [c for c in candidates if c.format == "fast"]
    jobs = jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {c.id: pool.submit(build, c, cuda_arch=cuda_arch, cache_dir=cache_dir, timeout_s=timeout_s)
                   for c in fast}
        return {cid: f.result() for cid, f in futures.items()}
