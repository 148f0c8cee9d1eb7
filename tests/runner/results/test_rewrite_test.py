"""A PyTorch rewrite's generated equivalence test (runner/results/rewrite_test.py), run with pytest on a repository
holding the rewrite: RowGain's `gain[:, None] * x` for `torch.diag(gain) @ x`, as the rewrite proposer writes it
(guarded on rank, rows and dtype; its precondition on the values stated) passes; the same multiply unguarded fails on
a 1-D input, a broadcast one, a float64 one and an inf, and the guarded one fails on the inf when nothing states it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runner.contract import Candidate, ProblemSpec
from runner.proposers.rewrite.proposer import rewrites
from runner.results.files import Provenance, rewrite_files, write_files
from runner.results.proposal import manifest_extra
from tests.runner.results.test_proposal import verdict

MODULE = '''import torch
import torch.nn as nn


class RowGain(nn.Module):
    def __init__(self, rows: int):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(rows) + 0.5)

    def forward(self, x):
        # x: [N, M]; gain: [N]
        return torch.diag(self.gain) @ x


def get_inputs():
    return [torch.randn(16, 8)]


def get_init_inputs():
    return [16]
'''
SPEC = ProblemSpec(name="RowGain", module="pkg.row_gain", class_name="RowGain", inputs="get_inputs",
                   init_inputs="get_init_inputs")


def _run(tmp_path, new_text: str, preconditions: list[str]) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "row_gain.py").write_text(MODULE)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    cand = Candidate(id="w", format="kernelbench", backend="cpu", sources={"model_new.py": "x"}, rewrite=new_text,
                     preconditions=preconditions)
    v = verdict()
    files = rewrite_files(SPEC, cand, v, Provenance.for_verdict(SPEC.name, v, commit=commit),
                          module_file="pkg/row_gain.py", original_text=MODULE,
                          extra=manifest_extra(v, backend="cpu", change="rewrite"))
    assert json.loads(files["rowgain/fusebot.json"])["preconditions"] == preconditions
    write_files(repo / "fusebot_kernels", files)
    (repo / "pkg" / "row_gain.py").write_text(new_text)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "fusebot_kernels"],
                          cwd=repo, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def proposed():
    (found,) = [r for r in rewrites(MODULE, "RowGain") if len(r.sites) == 1]
    return found


def test_the_proposers_guarded_rewrite_with_its_stated_precondition_passes(proposed, tmp_path):
    assert [s.precondition for s in proposed.sites][0].startswith("`x` holds no inf or NaN")
    done = _run(tmp_path, proposed.text, [s.precondition for s in proposed.sites])
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 passed" in done.stdout


def test_the_unguarded_multiply_fails_on_rank_broadcast_dtype_and_inf(tmp_path):
    done = _run(tmp_path, MODULE.replace("torch.diag(self.gain) @ x", "self.gain[:, None] * x"), [])
    assert done.returncode == 1, done.stdout[-3000:]
    for case in ("input 0: one dim fewer: the original raised", "input 0: first dim of size 1: the original raised",
                 "input 0: torch.float64: the original raised", "input 0: an inf: NaN where"):
        assert case in done.stdout, (case, done.stdout[-3000:])


def test_an_unstated_precondition_fails_the_guarded_rewrite_on_non_finite_values(proposed, tmp_path):
    done = _run(tmp_path, proposed.text, [])
    assert done.returncode == 1, done.stdout[-3000:]
    assert "input 0: an inf: NaN where" in done.stdout and "one dim fewer" not in done.stdout
