"""Tests of runner/catalog/. Beside the modules named by a test_<module>.py here (capture):
ir, opset, pattern, lowering, lower_views, lower_rows, recognition, views, skipping, schedule: test_catalog_aten.py
  (every construct captured, lowered, rendered to C++, built and verified by the harness), test_catalog.py and
  test_catalog_suite.py (the KernelBench pattern families), tests/bench/test_realworld_suite.py (the real-world suite)
rope: codegen/test_cuda_rope.py (rotate_half, GPT-J's pairs and pass-through columns recognised in the captured graph,
  a non-RoPE graph refused)
space, epilogue: test_catalog.py and test_catalog_suite.py (the strategies and parameter sets proposed; a heavy op on
  torch with its fused epilogue)
"""
