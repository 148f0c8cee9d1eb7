"""The edit a kernel PR makes to the marked module's file: the module binds its class's name to the drop-in's
subclass, FUSEBOT_DISABLE keeps the original class, and either module may be imported first. Checked on the PR's
files as generated (CPU backend), applied in a copy of the repository and imported in a fresh process where fusebot's
own packages cannot be imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runner.contract import Candidate, ProblemSpec, Verdict
from runner.results.adoption import adopted, block
from runner.results.files import Provenance, target_files, write_files
from runner.results.proposal import ROOT_PREFIX
from runner.results.remeasure import shim_source
from tests.verdicts import EXAMPLE, seed_candidate

ROOT = Path(__file__).resolve().parents[3]
KERNELS = "fusebot_kernels"
ROW_GAIN_CPP = r"""#include "fusebot.h"
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  (void)stream;
  if (n_in != 2 || n_out != 1) return 1;
  if (in[0].dtype != FB_FLOAT32 || in[1].dtype != FB_FLOAT32 || out[0].dtype != FB_FLOAT32) return 2;
  if (in[0].ndim != 2 || in[1].ndim != 1 || in[1].shape[0] != in[0].shape[0]) return 3;
  const int64_t rows = in[0].shape[0], cols = in[0].shape[1];
  const float* x = (const float*)in[0].data;
  const float* gain = (const float*)in[1].data;
  float* y = (float*)out[0].data;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = gain[r] * x[r * cols + c];
  return 0;
}
"""
# Imports the module (after the drop-in, with `first`), calls each class named where it can, and reports what it
# found; fusebot's own packages are made unimportable: the PR's code needs nothing but torch.
PROBE = """
import importlib, json, sys
sys.modules["runner"] = None
sys.modules["bot"] = None
import torch
module, names, first, init = sys.argv[1], sys.argv[2].split(","), sys.argv[3], json.loads(sys.argv[4])
if first:
    importlib.import_module(first)
m = importlib.import_module(module)
init = list(m.get_init_inputs()) if init is None else init
found = {}
for cls_name in names:
    cls = getattr(m, cls_name)
    original = vars(cls).get("fusebot_original", cls)
    torch.manual_seed(0)
    model = cls(*init).eval()
    plain = original(*init).eval()
    plain.load_state_dict(model.state_dict())
    x = m.get_inputs()
    with torch.no_grad():
        same = bool(torch.allclose(model(*x), plain(*x), atol=1e-5, rtol=1e-5))
    found[cls_name] = {"class_module": cls.__module__, "original_module": original.__module__, "is_subclass":
                       issubclass(cls, original), "kernel_calls": getattr(cls, "kernel_calls", None), "same": same,
                       "fusebot_loaded": any(k.split(".")[0] in ("runner", "bot") and v is not None
                                             for k, v in sys.modules.items())}
print(json.dumps(found))
"""


def test_the_edit_goes_at_the_end_once_and_only_where_it_can_import_the_dropin():
    text = EXAMPLE.read_text()
    edited = adopted(text, "ScaledBiasReLU", "fusebot_kernels/scaledbiasrelu")
    assert edited.startswith(text.rstrip("\n")) and edited.endswith(
        "ScaledBiasReLU = _fusebot_adopt(ScaledBiasReLU)\n")
    assert "from fusebot_kernels.scaledbiasrelu.dropin import adopt as _fusebot_adopt" in edited
    assert "FUSEBOT_DISABLE=1 keeps the" in edited
    assert adopted(edited, "ScaledBiasReLU", "fusebot_kernels/scaledbiasrelu") == edited  # once
    assert adopted(text, "NotThere", "fusebot_kernels/x") is None  # no class of that name at the top level
    assert adopted("def f():\n    class C: pass\n", "C", "k/c") is None
    assert block("C", "fusebot-kernels/c") is None  # not importable as a package: no edit
    compile(edited, "m.py", "exec")


def _repo(tmp_path: Path, module_file: str, text: str, spec: ProblemSpec, cand: Candidate) -> tuple[Path, dict]:
    """A copy of a repository holding the module, with the PR's files written and its edit applied."""
    root = tmp_path / "repo"
    path = root / module_file
    path.parent.mkdir(parents=True)
    path.write_text(text)
    for parent in Path(module_file).parents:
        if parent != Path(".") and not module_file.startswith("examples/"):
            (root / parent / "__init__.py").write_text("")
    v = Verdict(candidate_id=cand.id, problem=spec.name, accepted=True)
    files = target_files(spec, cand, v, Provenance.for_verdict(spec.name, v), kernels_dir=KERNELS,
                         module_file=module_file, module_text=text)
    write_files(root / KERNELS, files)
    path.write_text(files[ROOT_PREFIX + module_file])
    return root, files


def _probe(root: Path, tmp_path: Path, module: str, cls: str, init: list | None, *, first: str = "",
           disable: bool = False) -> dict:
    """What PROBE found of the class `cls` (several: comma-separated, a dict per class)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FUSEBOT_DISABLE")} | {
        "FUSEBOT_DROPIN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    if disable:
        env["FUSEBOT_DISABLE"] = "1"
    done = subprocess.run([sys.executable, "-c", PROBE, module, cls, first, json.dumps(init)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return found if "," in cls else found[cls]


CASES = {
    "the demo's example": ("examples/row_gain.py", "examples.row_gain", "RowGain", [8],
                           Candidate(id="rowgain", format="fast", backend="cpu", sources={"kernel.cpp": ROW_GAIN_CPP})),
    "a module in a package": ("mypkg/nn/layers.py", "mypkg.nn.layers", "ScaledBiasReLU", None, seed_candidate("cpu")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_edited_module_binds_the_dropin_and_fusebot_disable_the_original(tmp_path, case):
    module_file, module, cls, init, cand = CASES[case]
    text = (ROOT / "examples" / Path(module_file).name).read_text() if case == "the demo's example" else \
        EXAMPLE.read_text()
    if case == "the demo's example":  # a small instance: 8 rows
        text = text.replace("rows, cols = 1024, 512", "rows, cols = 8, 16")
    spec = ProblemSpec(name=cls, module=module, class_name=cls, second_inputs=None if cls == "RowGain" else
                       "get_second_inputs")
    root, files = _repo(tmp_path, module_file, text, spec, cand)
    folder = cls.lower()
    dropin_module = f"{KERNELS}.{folder}.dropin"
    assert files[ROOT_PREFIX + module_file].startswith(text.rstrip("\n"))  # the module's own text kept as it was

    on = _probe(root, tmp_path, module, cls, init)
    assert on["class_module"] == dropin_module and on["original_module"] == module and on["is_subclass"]
    assert on["kernel_calls"] == 1 and on["same"] and not on["fusebot_loaded"]

    first = _probe(root, tmp_path, module, cls, init, first=dropin_module)  # the drop-in imported before the module
    assert first["class_module"] == dropin_module and first["original_module"] == module and first["same"]

    off = _probe(root, tmp_path, module, cls, init, disable=True)
    assert off["class_module"] == module and off["original_module"] == module and off["kernel_calls"] is None
    assert off["same"]
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)


@pytest.mark.parametrize("how", ["module first", "drop-in first", "no kernels folder"])
def test_a_module_that_adopted_a_removed_or_absent_dropin_keeps_its_own_class(tmp_path, how):
    """Nightly hygiene replaces a stale drop-in by a shim, and a copy of the module may come without the kernels
    folder (a package installed without it): either way the module imports and keeps its own class."""
    root = tmp_path / "repo"
    (root / "examples").mkdir(parents=True)
    text = (ROOT / "examples" / "row_gain.py").read_text().replace("rows, cols = 1024, 512", "rows, cols = 8, 16")
    (root / "examples" / "row_gain.py").write_text(adopted(text, "RowGain", f"{KERNELS}/rowgain"))
    if how != "no kernels folder":
        (root / KERNELS / "rowgain").mkdir(parents=True)
        for init in (root / KERNELS / "__init__.py", root / KERNELS / "rowgain" / "__init__.py"):
            init.write_text("")
        spec = ProblemSpec(name="RowGain", module="examples.row_gain", class_name="RowGain")
        (root / KERNELS / "rowgain" / "dropin.py").write_text(shim_source(spec))
    first = f"{KERNELS}.rowgain.dropin" if how == "drop-in first" else ""
    found = _probe(root, tmp_path, "examples.row_gain", "RowGain", [8], first=first)
    assert found["class_module"] == "examples.row_gain" and found["kernel_calls"] is None and found["same"]


def test_a_missing_module_the_dropin_itself_needs_is_not_hidden(tmp_path):
    root = tmp_path / "repo"
    (root / "examples").mkdir(parents=True)
    (root / "examples" / "row_gain.py").write_text(adopted(EXAMPLE.read_text(), "ScaledBiasReLU", f"{KERNELS}/s"))
    (root / KERNELS / "s").mkdir(parents=True)
    (root / KERNELS / "s" / "dropin.py").write_text("import not_installed_anywhere\n")
    done = subprocess.run([sys.executable, "-c", "import examples.row_gain"], cwd=root, capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode != 0 and "No module named 'not_installed_anywhere'" in done.stderr


# The demo's example with a second marked class beside RowGain, each its own target (one kernel PR each).
ROW_SCALE = """

# fusebot: optimize
class RowScale(nn.Module):
    def __init__(self, rows: int):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(rows) + 0.5)

    def forward(self, x):
        return x * self.scale[:, None]
"""
TWO_CLASSES = (ROOT / "examples" / "row_gain.py").read_text().replace(
    "\n\nrows, cols = 1024, 512", ROW_SCALE + "\n\nrows, cols = 8, 16")


def _adopted_in_order(root: Path, order: tuple[str, ...]) -> str:
    """The file TWO_CLASSES as the kernel PRs of `order` leave it, each made on the file as the one before left it
    (merged), in a copy of the repository at `root` with their kernels folders."""
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    cand = Candidate(id="rowgain", format="fast", backend="cpu", sources={"kernel.cpp": ROW_GAIN_CPP})
    text = TWO_CLASSES
    for cls in order:
        spec = ProblemSpec(name=cls, module="mypkg.gains", class_name=cls)
        v = Verdict(candidate_id=cand.id, problem=spec.name, accepted=True)
        files = target_files(spec, cand, v, Provenance.for_verdict(spec.name, v), kernels_dir=KERNELS,
                             module_file="mypkg/gains.py", module_text=text)
        assert [k for k in files if k.startswith(ROOT_PREFIX)] == [ROOT_PREFIX + "mypkg/gains.py"]
        write_files(root / KERNELS, files)
        edit = files[ROOT_PREFIX + "mypkg/gains.py"]
        assert edit.startswith(text.rstrip("\n")) and edit.count(" = _fusebot_adopt(") == text.count(
            " = _fusebot_adopt(") + 1  # its own lines added, the earlier ones kept
        text = edit
    (root / "mypkg" / "gains.py").write_text(text)
    return text


def test_each_marked_class_of_a_file_is_adopted_by_its_own_pr_and_a_second_keeps_the_first(tmp_path):
    """Each PR adopts its own target; the second PR's edit adds its lines and keeps the first's, in either order:
    both classes bind their drop-ins (whichever module is imported first), FUSEBOT_DISABLE=1 both originals."""
    both = "RowGain,RowScale"
    for order in (("RowGain", "RowScale"), ("RowScale", "RowGain")):
        root = tmp_path / "-".join(order)
        text = _adopted_in_order(root, order)
        assert "RowGain = _fusebot_adopt(RowGain)\n" in text and "RowScale = _fusebot_adopt(RowScale)\n" in text
        for cls in order:
            assert adopted(text, cls, f"{KERNELS}/{cls.lower()}") == text  # an edit made again changes nothing
        probes = [_probe(root, tmp_path, "mypkg.gains", both, None)]
        if order[0] == "RowGain":  # the drop-in of the class adopted last imported first; then switched off
            probes.append(_probe(root, tmp_path, "mypkg.gains", both, None, first=f"{KERNELS}.rowscale.dropin"))
            off = _probe(root, tmp_path, "mypkg.gains", both, None, disable=True)
            for cls in ("RowGain", "RowScale"):
                assert off[cls]["class_module"] == "mypkg.gains" and off[cls]["kernel_calls"] is None
                assert off[cls]["same"]
        for found in probes:
            for cls in ("RowGain", "RowScale"):
                assert found[cls]["class_module"] == f"{KERNELS}.{cls.lower()}.dropin", (order, cls, found)
                assert found[cls]["original_module"] == "mypkg.gains" and found[cls]["is_subclass"]
                assert found[cls]["kernel_calls"] == 1 and found[cls]["same"] and not found[cls]["fusebot_loaded"]
