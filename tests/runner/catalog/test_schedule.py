"""The scheduler's cut of a graph into heavy ops and fused programs, on hand-built graphs (no capture)."""

from __future__ import annotations

from runner.catalog.capture import CGraph, CNode
from runner.catalog.recognition import recognise
from runner.catalog.schedule import plan


def _rotary_prologue() -> CGraph:
    """transformers' Llama rotary embedding before its rewrite as a broadcast: a bf16 inverse-frequency buffer cast to
    float32 as [B, D, 1], the position ids cast to float32 as [B, 1, T], then `@`: two operands of one size (B*D*T
    with D == T) and different shapes."""
    def ref(name: str) -> dict:
        return {"ref": name}
    nodes = [
        CNode(name="inv_freq", op="input", shape=[2, 8, 1], dtype="bfloat16", index=0),
        CNode(name="position_ids", op="input", shape=[2, 1, 8], dtype="int64", index=1),
        CNode(name="f", op="_to_copy", args=[ref("inv_freq")], kwargs={"dtype": "float32"}, shape=[2, 8, 1],
              dtype="float32"),
        CNode(name="p", op="_to_copy", args=[ref("position_ids")], kwargs={"dtype": "float32"}, shape=[2, 1, 8],
              dtype="float32"),
        CNode(name="freqs", op="matmul", args=[ref("f"), ref("p")], shape=[2, 8, 8], dtype="float32"),
        CNode(name="c", op="cos", args=[ref("freqs")], shape=[2, 8, 8], dtype="float32"),
        CNode(name="output", op="output", args=[[ref("c")]]),
    ]
    return CGraph(nodes=nodes, n_inputs=2)


def test_operands_of_one_size_and_different_shapes_are_two_programs():
    stages = plan(_rotary_prologue()).stages
    assert [(s.kind, s.outputs) for s in stages] == [("fused", ["f"]), ("fused", ["p"]), ("heavy", ["freqs"]),
                                                     ("fused", ["c"])]
    pat = recognise(_rotary_prologue())
    assert pat.family == "graph", pat.reason
