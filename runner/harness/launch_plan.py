"""Device code only: the cubin and PTX a CUDA drop-in ships, and its launch plans (what the host code launches).

A catalog kernel's host code (fusebot_forward: the set-up, the choice of kernel, grid, block, shared memory and the
argument struct) runs once here, on the runner, per verified call: linked with runner/csrc/fb_record.cpp in place of
the CUDA runtime's launch entry points and called on descriptors of the verified shapes with stand-in pointers, it
writes down each step instead of launching it. A plan is those steps with every stand-in pointer replaced by a slot
(which tensor, at what byte offset): the drop-in fills the slots with its tensors' addresses and launches the steps
from the shipped cubin through the CUDA driver API (runner/shipped/dropin/device.py). No host code ships.

    cubin, ptx = device_code(source, "sm_90", work)        # nvcc -cubin / -ptx, the commands the PR states
    plans = record(source, "sm_90", calls, work)             # [{"inputs", "outputs", "workspace", "steps"}]

The recording runs confined in a child process (`python -m runner.harness.launch_plan LIB CALLS.json`), as every
build does: the host code is generated, but it is compiled C++.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

from runner.dtypes import ABI_DTYPES
from runner.harness.sandbox import confined_env

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parents[1] / "csrc"
RECORDER = CSRC / "fb_record.cpp"
DEVICE_FLAGS = ("-O3", "-std=c++17")  # the device code's flags: the harness's (runner/harness/build.py) less the host's
PLANS_FILE = "plans.json"
STAND_IN_SHIFT = 40  # tensor k's stand-in address is (k + 1) << 40: aligned beyond any vector access, never a size
WORKSPACE_SLOT = -1  # the slot of the workspace (the drop-in's scratch memory from torch's allocator)


class PlanError(RuntimeError):
    """The host code's steps cannot be written down as a plan (a step the recorder does not know)."""


def cubin_command(arch: str, source: str = "kernel.cu", out: str = "") -> list[str]:
    """The command that makes the shipped cubin from the kernel's source (run beside fusebot.h)."""
    return ["nvcc", "-cubin", f"-arch={arch}", *DEVICE_FLAGS, "-I", ".", source, "-o", out or f"kernel.{arch}.cubin"]


def ptx_command(arch: str, source: str = "kernel.cu", out: str = "") -> list[str]:
    """The command that makes the shipped PTX (for GPUs newer than `arch`, compiled by the driver)."""
    virt = "compute_" + arch.removeprefix("sm_")
    return ["nvcc", "-ptx", f"-arch={virt}", *DEVICE_FLAGS, "-I", ".", source, "-o", out or ptx_filename(arch)]


def cubin_filename(arch: str) -> str:
    """The shipped cubin's file: base64 text of what cubin_command writes to `kernel.<arch>.cubin`."""
    return f"kernel.{arch}.cubin.b64"


def ptx_filename(arch: str) -> str:
    return f"kernel.compute_{arch.removeprefix('sm_')}.ptx"


# ---- the cubin's kernels and their parameters ------------------------------------------------------------------

_EIATTR_KPARAM_INFO = 0x17
_EIFMT_SVAL, _EIFMT_HVAL, _EIFMT_BVAL, _EIFMT_NVAL = 4, 3, 2, 1


def _sections(elf: bytes) -> list[tuple[str, int, int, int, int]]:
    """A 64-bit little-endian ELF's sections: (name, type, file offset, size, link)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    raw = [struct.unpack_from("<IIQQQQI", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4]
    return [(_cstr(elf, names_at + n), typ, off, size, link) for n, typ, _f, _a, off, size, link in raw]


def _cstr(data: bytes, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode()


def function_symbols(elf: bytes) -> dict[str, int]:
    """Every function in an ELF file's .symtab (local ones too: nvcc hides a kernel's host function) -> its value."""
    sections = _sections(elf)
    out: dict[str, int] = {}
    for name, typ, off, size, link in sections:
        if name != ".symtab" or typ != 2:
            continue
        strings = sections[link][2]
        for at in range(off, off + size, 24):
            st_name, st_info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", elf, at)
            if st_info & 0xF == 2 and value:  # STT_FUNC, defined
                out.setdefault(_cstr(elf, strings + st_name), value)
    return out


def kernel_params(cubin: bytes) -> dict[str, list[tuple[int, int]]]:
    """Each kernel of an ELF cubin and its parameters as (byte offset, size), in order: from the EIATTR_KPARAM_INFO
    records of its `.nv.info.<name>` section. A record is its format and attribute bytes, then its value (none, one
    byte, two bytes, or a 16-bit size and that many bytes), padded to a multiple of 4 bytes. PlanError for a section
    this cannot read."""
    out: dict[str, list[tuple[int, int]]] = {}
    for sname, _typ, off, size, _link in _sections(cubin):
        if not sname.startswith(".nv.info."):
            continue
        params: dict[int, tuple[int, int]] = {}
        data, i = cubin[off:off + size], 0
        while i + 4 <= len(data):
            fmt, attr = data[i], data[i + 1]
            if fmt == _EIFMT_SVAL:
                (n,) = struct.unpack_from("<H", data, i + 2)
                if attr == _EIATTR_KPARAM_INFO:
                    _index, ordinal, offset, word = struct.unpack_from("<IHHI", data, i + 4)
                    params[ordinal] = (offset, (word >> 18) & 0x3FFF)
                i += 4 + -(-n // 4) * 4
            elif fmt in (_EIFMT_HVAL, _EIFMT_BVAL, _EIFMT_NVAL):
                i += 4
            else:
                raise PlanError(f"{sname}: an attribute of unknown format {fmt} at byte {i}")
        out[sname.removeprefix(".nv.info.")] = [params[k] for k in sorted(params)]
    return out


# ---- building ----------------------------------------------------------------------------------------------------

def _run(cmd: list[str], work: Path, timeout_s: float) -> str:
    from runner.harness.build import BUILD_MEMORY_BYTES, _run_confined  # the builds' confinement  # noqa: PLC0415

    done, text = _run_confined(cmd, work, confined_env(work), timeout_s, BUILD_MEMORY_BYTES)
    if done.returncode != 0:
        raise PlanError(f"{' '.join(cmd)} failed:\n{text[-4000:]}")
    return text


def _stage(source: str, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    (work / "kernel.cu").write_text(source)
    shutil.copy(CSRC / "fusebot.h", work / "fusebot.h")


def device_code(source: str, arch: str, work: Path, *, timeout_s: float = 300.0) -> tuple[bytes, str]:
    """The cubin for `arch` and the PTX for its virtual arch, made by cubin_command and ptx_command."""
    _stage(source, work)
    _run(cubin_command(arch, out="kernel.cubin"), work, timeout_s)
    _run(ptx_command(arch, out="kernel.ptx"), work, timeout_s)
    return (work / "kernel.cubin").read_bytes(), (work / "kernel.ptx").read_text()


def record(source: str, arch: str, calls: list[dict], work: Path, *, cubin: bytes | None = None,
           timeout_s: float = 300.0) -> list[dict]:
    """The plan of each call in `calls` ([{"inputs": [[dtype, shape], ...], "outputs": [...]}], ABI order: the
    forward's arguments, then the state), from the host code built with the recorder. PlanError when a step cannot
    be written down."""
    _stage(source, work)
    cubin = cubin if cubin is not None else device_code(source, arch, work, timeout_s=timeout_s)[0]
    (work / "params.json").write_text(json.dumps(kernel_params(cubin)))
    (work / "fb_record.cpp").write_text(RECORDER.read_text())
    num = arch.removeprefix("sm_")
    rpath = [f"-Xlinker=-rpath={d}" for d in _runtime_dirs()]  # the toolkit's libcudart, wherever ld.so looks
    _run(["nvcc", *DEVICE_FLAGS, "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", "-Xlinker", "-Bsymbolic",
          *rpath, f"-gencode=arch=compute_{num},code={arch}", "-I", ".", "kernel.cu", "fb_record.cpp", "-o",
          "record.so"], work, timeout_s)
    (work / "calls.json").write_text(json.dumps(calls))
    _run([sys.executable, "-m", "runner.harness.launch_plan", "record.so", "params.json", "calls.json"], work,
         timeout_s)
    data = json.loads((work / PLANS_FILE).read_text())
    if "error" in data:
        raise PlanError(data["error"])
    return data["plans"]


def _runtime_dirs() -> list[str]:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parents[1]))
    homes.append("/usr/local/cuda")
    dirs = [Path(h) / sub for h in homes if h for sub in ("lib64", "targets/x86_64-linux/lib")]
    return list(dict.fromkeys(str(d) for d in dirs if d.is_dir()))


def record_in(source: str, arch: str, calls: list[dict], **kw) -> list[dict]:
    """record() in a temporary folder of its own."""
    with tempfile.TemporaryDirectory(prefix="fusebot-plan-") as tmp:
        return record(source, arch, calls, Path(tmp), **kw)


# ---- the recording (the child process) ---------------------------------------------------------------------------

class _FbTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]


_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "bool": 1, "uint8": 1,
         "int8": 1}


def _describe(specs: list[list], first: int) -> tuple[ctypes.Array, list[int]]:
    arr = (_FbTensor * max(len(specs), 1))()
    nbytes = []
    for j, (dtype, shape) in enumerate(specs):
        t = arr[j]
        t.data = (first + j + 1) << STAND_IN_SHIFT
        t.dtype, t.ndim = ABI_DTYPES[dtype], len(shape)
        stride = 1
        for d in range(len(shape) - 1, -1, -1):
            t.shape[d], t.strides[d] = shape[d], stride
            stride *= shape[d]
        nbytes.append(stride * _ITEM[dtype])
    return arr, nbytes


def _slot(value: int, sizes: dict[int, int]) -> tuple[int, int] | None:
    """(tensor, byte delta) of a stand-in address, or None for any other value."""
    k, delta = (value >> STAND_IN_SHIFT) - 1, value & ((1 << STAND_IN_SHIFT) - 1)
    if k in sizes and delta <= sizes[k]:
        return k, delta
    return None


def _steps(text: str, sizes: dict[int, int], ws: int) -> list[dict]:
    slots = {**sizes, ws: max(sizes.get(ws, 0), 0)}
    steps: list[dict] = []
    for line in text.splitlines():
        word, *rest = line.split()
        if word == "launch":
            name, *nums, params = rest
            g, b, shmem, coop, cl = nums[0:3], nums[3:6], nums[6], nums[7], nums[8:11]
            raw = bytes.fromhex(params)
            found = []
            for off in range(0, len(raw) - 7, 8):
                hit = _slot(struct.unpack_from("<Q", raw, off)[0], slots)
                if hit:
                    found.append([off, WORKSPACE_SLOT if hit[0] == ws else hit[0], hit[1]])
            steps.append({"op": "launch", "kernel": name, "grid": [int(x) for x in g], "block": [int(x) for x in b],
                          "shmem": int(shmem), "cooperative": int(coop), "cluster": [int(x) for x in cl],
                          "params": params, "slots": found})
        elif word == "memset":
            hit = _slot(int(rest[0]), slots)
            if hit is None:
                raise PlanError(f"a memset of memory that is not a tensor's: {line}")
            steps.append({"op": "memset", "slot": [WORKSPACE_SLOT if hit[0] == ws else hit[0], hit[1]],
                          "value": int(rest[1]), "bytes": int(rest[2])})
        elif word == "attribute":
            steps.append({"op": "attribute", "kernel": rest[0], "attribute": int(rest[1]), "value": int(rest[2])})
        else:
            raise PlanError(f"the host code did something a plan cannot hold: {line}")
    return steps


def plan_call(lib: ctypes.CDLL, call: dict) -> dict:
    """One call's plan: fusebot_forward on stand-in descriptors, with the workspace it asks for."""
    ins, in_bytes = _describe(call["inputs"], 0)
    n_in = len(call["inputs"])
    outs, out_bytes = _describe(call["outputs"], n_in)
    sizes = dict(enumerate(in_bytes + out_bytes))
    ws_index = n_in + len(call["outputs"])
    forward = lib.fusebot_forward
    forward.restype = ctypes.c_int
    set_ws, need_fn = getattr(lib, "fusebot_set_workspace", None), getattr(lib, "fusebot_workspace_need", None)
    need = 0
    for _ in range(2):
        if set_ws is not None:
            set_ws.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            set_ws((ws_index + 1) << STAND_IN_SHIFT if need else None, need)
        lib.fusebot_record_take()
        rc = forward(ins, n_in, outs, len(call["outputs"]), None)
        text = ctypes.string_at(lib.fusebot_record_take()).decode()
        asked = 0
        if need_fn is not None:
            need_fn.restype = ctypes.c_size_t
            asked = need_fn()
        if asked <= need:
            break
        need = asked
    if rc != 0:
        err = getattr(lib, "fusebot_last_error", None)
        why = ""
        if err is not None:
            err.restype = ctypes.c_char_p
            why = (err() or b"").decode(errors="replace")
        raise PlanError(f"the host code refused a verified call ({rc}): {why}")
    sizes[ws_index] = need
    return {"inputs": call["inputs"], "outputs": call["outputs"], "workspace": need,
            "steps": _steps(text, sizes, ws_index)}


def main(argv: list[str]) -> int:
    lib_path, params_path, calls_path = (Path(a).resolve() for a in argv[:3])
    out = calls_path.parent / PLANS_FILE
    try:
        lib = ctypes.CDLL(str(lib_path))
        lib.fusebot_record_take.restype = ctypes.c_void_p
        lib.fusebot_record_base.restype = ctypes.c_void_p
        lib.fusebot_record_params.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                                              ctypes.c_void_p]
        base, where = lib.fusebot_record_base(), function_symbols(lib_path.read_bytes())
        for name, params in json.loads(params_path.read_text()).items():
            if name not in where:
                continue
            n = len(params)
            lib.fusebot_record_params(base + where[name], name.encode(), n,
                                      (ctypes.c_int * max(n, 1))(*[p[0] for p in params]),
                                      (ctypes.c_int * max(n, 1))(*[p[1] for p in params]))
        plans = [plan_call(lib, c) for c in json.loads(calls_path.read_text())]
        out.write_text(json.dumps({"plans": plans}))
    except (PlanError, OSError, KeyError, ValueError) as exc:
        out.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
