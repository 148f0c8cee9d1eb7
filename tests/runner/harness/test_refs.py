"""A factory reference, `name` or `package.module:name`: one resolver, the harness's, whose source text every shipped
file (the drop-in, its test, the bench script) carries instead of a copy of its own."""

from __future__ import annotations

import types

import pytest

from runner.contract import ProblemSpec
from runner.harness.dropin import dropin_source
from runner.harness.refs import resolve, resolve_source
from runner.results.bench_script import bench_source
from runner.results.dropin_test import dropin_test_source


def test_a_name_is_read_from_the_module_and_a_module_path_is_imported():
    module = types.SimpleNamespace(get_inputs=lambda: [1])
    assert resolve(module, "get_inputs")() == [1]
    assert resolve(module, "os.path:join") is __import__("os.path").path.join
    with pytest.raises(AttributeError):
        resolve(module, "get_init_inputs")
    with pytest.raises(ImportError):
        resolve(module, "no_such_module_here:f")


def test_its_source_runs_where_fusebot_is_not_importable():
    namespace: dict = {"importlib": __import__("importlib")}
    exec(resolve_source("_resolve"), namespace)  # noqa: S102 - fusebot's own function
    assert namespace["_resolve"](types.SimpleNamespace(x=3), "x") == 3
    assert namespace["_resolve"](None, "os.path:sep") == __import__("os").path.sep


@pytest.mark.parametrize("shipped", ["dropin", "test", "bench"])
def test_every_shipped_file_carries_the_one_resolver(shipped):
    spec = ProblemSpec(name="row_gain", path="examples/row_gain.py", class_name="RowGain", init_inputs="m:init")
    text = {"dropin": lambda: dropin_source(spec, "cpu"), "test": lambda: dropin_test_source(spec, "cpu"),
            "bench": lambda: bench_source(spec, backend="cpu", target_folder="row_gain", kernels_dir="k")}[shipped]()
    assert text.count(resolve_source("_resolve")) == 1
    assert text.count('if ":" in ') == 1  # no second resolver beside it
