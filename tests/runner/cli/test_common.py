"""What the typer shells share: help pages a kernel engineer reads like pytest's or ruff's (`-h`, a description,
`Usage: fusebot eval [OPTIONS] REFERENCE CANDIDATE`, no `<bool>` or `{reference}`), `--backend cuda` refused in one
line by a torch without CUDA, and error lines never wrapped off a terminal."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from runner.cli import common
from runner.cli.bench import bench_app
from runner.cli.eval import eval_app
from runner.cli.optimize import optimize_app
from runner.contract import EXIT_STATUS
from runner.errors import UsageError

ROOT = Path(__file__).resolve().parents[3]
APPS = {"eval": (eval_app, "REFERENCE CANDIDATE"), "optimize": (optimize_app, "FILE[:CLASS]"),
        "bench": (bench_app, "SUITE")}


@pytest.mark.parametrize("name", sorted(APPS))
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_has_a_description_capital_metavars_and_no_type_tags(name, flag):
    app, arguments = APPS[name]
    result = CliRunner().invoke(app, [flag], prog_name=f"fusebot {name}")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"Usage: fusebot {name} [OPTIONS] {arguments}"
    assert lines[1] == "" and lines[2].strip() and not lines[2].startswith("Arguments")  # a description
    table = result.stdout.split("Exit status:\n", 1)[1]  # the one table of every command, unwrapped
    assert [line.split(None, 1) for line in table.splitlines()[:len(EXIT_STATUS)]] == \
        [[str(int(code)), meaning] for code, meaning in EXIT_STATUS.items()]
    assert not re.search(r"<(bool|path|file|int|float|str|text)[^>]*>", result.stdout), result.stdout
    assert "{" not in result.stdout and "-h, --help" in result.stdout


def test_backend_cuda_without_cuda_in_torch_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(common, "torch_has_cuda", lambda: False)
    with pytest.raises(UsageError) as e:
        common.choose_backend("cuda")
    assert str(e.value) == f"--backend cuda: this torch has no CUDA (torch {torch.__version__})"
    assert common.choose_backend("cpu") == "cpu"
    with pytest.raises(UsageError, match="--backend gpu: expected cuda or cpu"):
        common.choose_backend("gpu")


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a torch built without CUDA")
@pytest.mark.parametrize("command", ["eval", "optimize"])
def test_backend_cuda_on_a_cpu_torch_says_so_in_one_line_and_exits_2(tmp_path, command):
    problem = str(ROOT / "tests/fixtures/problems/scale_relu.py")
    args = [problem, str(ROOT / "tests/fixtures/candidates/scale_relu_load_inline.py")] if command == "eval" else \
        [problem, "--out", str(tmp_path / "o")]
    p = subprocess.run([sys.executable, "-m", "bot.cli", command, *args, "--backend", "cuda"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr == f"error: --backend cuda: this torch has no CUDA (torch {torch.__version__})\n"
    assert p.stdout == ""


def test_errors_are_not_wrapped_when_stderr_is_not_a_terminal(tmp_path):
    deep = tmp_path / ("a-folder-with-a-long-name-" * 3) / "models"
    deep.mkdir(parents=True)
    f = deep / "layers.py"
    f.write_text("class A:\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    p = subprocess.run([sys.executable, "-m", "bot.cli", "optimize", f"{f}:B", "--out", str(tmp_path / "o")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    line = f"error: {f} defines no class 'B'; it defines {f}:A"
    assert len(line) > 160 and p.stderr == line + "\n"


def test_a_failure_is_one_line_and_its_details_wait_for_verbose(capsys):
    root = logging.getLogger()
    saved = root.level
    try:
        root.setLevel(logging.WARNING)
        exit_ = common.fail("machine: judge failed during init\nTraceback (most recent call last):\n  ...", 3)
        assert exit_.exit_code == 3
        assert capsys.readouterr().err == "error: machine: judge failed during init (-v shows the details)\n"
    finally:
        root.setLevel(saved)
