"""The table of arguments comes from the problem itself, loaded as the harness loads it, in a confined child."""

from __future__ import annotations

from runner.contract import ProblemSpec, SearchBudget
from runner.proposers.llm.inputs import describe_inputs
from runner.proposers.llm.proposer import llm_proposers
from runner.search.loop import search
from tests.fakes.evaluators import TableEvaluator
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.runner.conftest import PROBLEMS
from tests.runner.llm_helpers import IDEAS, code_answer, settings
from tests.runner.proposers.llm.test_proposer import CTX, IDEAS_T, IMPL_T


def test_both_shape_sets_are_described_with_parameters_and_outputs(tmp_path):
    spec = ProblemSpec(name="scale_relu", path=str(PROBLEMS / "scale_relu.py"), second_inputs="get_second_inputs")
    sets = describe_inputs(spec)
    assert [s.shape_set for s in sets] == [0, 1]
    rows = [[(t.name, t.role, t.shape, t.strides, t.dtype) for t in s.tensors] for s in sets]
    assert rows[0] == [("x", "input", [64, 256], [256, 1], "float32"), ("bias", "param", [256], [1], "float32"),
                       ("out0", "output", [64, 256], [256, 1], "float32")]
    assert rows[1][0] == ("x", "input", [193, 256], [256, 1], "float32")
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_inputs():\n    raise ValueError\n")
    assert describe_inputs(ProblemSpec(name="broken", path=str(broken))) == []


def test_flags_a_kernel_asks_for_reach_its_candidate(tmp_path):
    answer = code_answer("ms=0.5").replace('#include "fusebot.h"', '#include "fusebot.h"\n// fusebot-flags: fast-math')
    ev = TableEvaluator()
    with ScriptedLLM([Reply(IDEAS, match=IDEAS_T), Reply(answer, match=IMPL_T)]) as srv:
        search(CTX, ev, llm_proposers(settings(srv.url)),
               SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1), tmp_path / "t.jsonl")
    assert ev.evaluated[0].extra_cflags == ["-ffast-math"]  # the CPU backend's fast math
