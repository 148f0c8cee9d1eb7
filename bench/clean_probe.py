"""What a maintainer checks of a PR's drop-in beyond the tests it ships, in a process that has torch and nothing of
fusebot: run from the PR's checkout, by path, with a virtualenv of torch, pytest and the module's own libraries
(bench/clean_venv.py). For the target folder given (fusebot_kernels/<target>), each check prints one line
`ok|FAILED|n/a <check>: <detail>`; the exit status is 1 when any check failed.

    python /path/to/fusebot/bench/clean_probe.py fusebot_kernels/rowgain

The checks: fusebot and nvcc absent; the drop-in matches the original at the verified inputs with its kernel run and,
for device code, no host library loaded; after deepcopy, pickle and torch.save; under torch.compile and (CUDA) graph
capture; and at another size (an input cut to half along a dimension the original takes cut), where it matches the
original, by its kernel or by falling back with a warning.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import pickle
import shutil
import sys
import warnings
from pathlib import Path

import torch

RESULTS: list[tuple[str, str, str]] = []


def check(name: str, fn) -> None:
    try:
        detail = fn()
        RESULTS.append(("n/a" if detail is None else "ok", name, detail or "does not apply"))
    except Exception as e:  # noqa: BLE001 - every check is reported, the first failure does not hide the others
        RESULTS.append(("FAILED", name, f"{type(e).__name__}: {e}"[:400]))


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    folder = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(Path.cwd()))  # the PR's checkout: the marked module imports as the repository has it
    target = folder.name
    test = load(next(folder.glob("test_*.py")), f"probe_test_{target}")
    dropin = load(folder / "dropin.py", "fusebot_dropin_" + target)
    cls = getattr(dropin, test.CLASS)
    cuda = test.DEVICE == "cuda"

    def absent():
        for name in ("runner", "bot", "fusebot"):
            if importlib.util.find_spec(name) is not None:
                raise AssertionError(f"{name} is importable")
        if shutil.which("nvcc"):
            raise AssertionError(f"nvcc is on PATH: {shutil.which('nvcc')}")
        return "runner, bot, fusebot and nvcc absent"

    check("nothing of fusebot", absent)
    original, fused = test._pair(dropin, 0)
    inputs = test._inputs(dropin, test.SHAPES[0], 0)
    with torch.no_grad():
        want = original(*inputs)

    def same(model, label: str, kernel: bool = True) -> str:
        calls = cls.kernel_calls
        with torch.no_grad():
            got = model(*inputs)
        torch.testing.assert_close(got, want, atol=test.ATOL, rtol=test.RTOL)
        if kernel and cls.kernel_calls <= calls:
            raise AssertionError(f"{label}: the original ran, not the kernel")
        return f"{label}: matches, {cls.kernel_calls - calls} kernel call(s)"

    def verified():
        out = same(fused, "verified inputs")
        if cuda and getattr(dropin, "DEVICE_CODE", False):
            if dropin._LIBS:
                raise AssertionError("a host library was loaded beside the device code")
            out += ", from device code (no host library loaded)"
        return out

    check("verified inputs", verified)
    check("deepcopy", lambda: same(copy.deepcopy(fused), "deepcopy"))
    check("pickle", lambda: same(pickle.loads(pickle.dumps(fused)), "pickle"))

    def saved():
        buf = io.BytesIO()
        torch.save(fused, buf)
        buf.seek(0)
        return same(torch.load(buf, weights_only=False), "torch.save and torch.load")

    check("torch.save", saved)
    check("torch.compile", lambda: same(torch.compile(fused), "torch.compile", kernel=False))
    if cuda:
        def graphed():
            with torch.no_grad():
                fused(*inputs)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = fused(*inputs)
                graph.replay()
                torch.cuda.synchronize()
            torch.testing.assert_close(out, want, atol=test.ATOL, rtol=test.RTOL)
            return "captured and replayed: matches"

        check("CUDA graph", graphed)

    def other_size():
        """One input tensor cut to half along the last of its dimensions the original still takes it cut along."""
        for k, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                continue
            for d in reversed(range(x.dim())):
                if x.shape[d] < 2:
                    continue
                cut = [*inputs[:k], x.narrow(d, 0, x.shape[d] // 2).contiguous(), *inputs[k + 1:]]
                try:
                    with torch.no_grad():
                        want_cut = original(*cut)
                except Exception:  # noqa: BLE001 - the original itself does not take that size
                    continue
                calls = cls.kernel_calls
                with warnings.catch_warnings(record=True) as seen, torch.no_grad():
                    warnings.simplefilter("always")
                    got = fused(*cut)
                torch.testing.assert_close(got, want_cut, atol=test.ATOL, rtol=test.RTOL)
                fell_back = cls.kernel_calls == calls
                if fell_back and not any(issubclass(w.category, dropin.FallbackWarning) for w in seen):
                    raise AssertionError("fell back to the original without a warning")
                ran = "the original ran, with a warning" if fell_back else "the kernel ran"
                return f"input {k} cut to {list(cut[k].shape)}: matches, {ran}"
        return None

    check("another size", other_size)
    for status, name, detail in RESULTS:
        sys.stdout.write(f"{status} {name}: {detail}\n")
    return 1 if any(s == "FAILED" for s, _, _ in RESULTS) else 0


if __name__ == "__main__":
    sys.exit(main())
