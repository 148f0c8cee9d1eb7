"""The library a PR ships beside its drop-in: built by the runner, portable flags, text that decodes to its bytes."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from runner.contract import Candidate
from runner.harness import build, dropin_ship
from runner.harness.dropin import dropin_files
from tests.runner.harness.test_dropin import KERNEL, SPEC2
from tests.verdicts import seed_candidate


def test_the_shippable_flags_are_portable():
    cpu = build.shippable_toolchain("cpu")
    assert "-march=native" not in cpu.flags and cpu.target == build.cpu_level()
    if cpu.target.startswith("x86-64"):
        assert f"-march={cpu.target}" in cpu.flags
    cuda = build.shippable_toolchain("cuda", "sm_90") if shutil.which("nvcc") else None
    if cuda is not None:
        assert {"-cudart", "static", "-gencode=arch=compute_90,code=sm_90",
                "-gencode=arch=compute_90,code=compute_90"} <= set(cuda.flags)  # SASS, and PTX for later GPUs


def test_the_shipped_text_decodes_to_the_library_it_names(tmp_path):
    cand = Candidate(id="t", format="fast", backend="cpu", sources={"kernel.cpp": KERNEL})
    lib = dropin_ship.shipped_library(cand, cache_dir=tmp_path / "build")
    assert lib is not None and lib.arch == build.cpu_level() and lib.name == f"kernel.{lib.arch}.so.b64"
    data = dropin_ship.decode(lib.text)
    assert hashlib.sha256(data).hexdigest() == lib.sha256 and data[:4] == b"\x7fELF"
    assert lib.text.startswith("# fusebot kernel library for") and lib.sha256 in lib.text.splitlines()[0]
    files = dropin_files(SPEC2, cand, "ab" * 32)
    assert set(files) == {"dropin.py", lib.name}
    assert f"SHIPPED = {{{lib.arch!r}: ({lib.name!r}, {lib.sha256!r})}}" in files["dropin.py"]


def test_a_kernel_that_does_not_build_ships_no_library(tmp_path):
    cand = Candidate(id="t", format="fast", backend="cpu", sources={"kernel.cpp": "this is not C++"})
    assert dropin_ship.shipped_library(cand, cache_dir=tmp_path / "build") is None
    files = dropin_files(SPEC2, cand, "ab" * 32)
    assert set(files) == {"dropin.py"} and "SHIPPED = {}" in files["dropin.py"]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc (no GPU needed)")
def test_a_shippable_cuda_library_needs_only_the_driver(tmp_path):
    out = build.build(seed_candidate("cuda"), cache_dir=tmp_path / "build",
                      tc=build.shippable_toolchain("cuda", "sm_90"))
    assert out.info.ok, out.info.log
    needed = subprocess.run(["readelf", "-d", str(out.library)], capture_output=True, text=True).stdout
    assert "libcudart" not in needed  # the CUDA runtime is inside; libcuda comes from the driver at run time
