"""Tests of runner/catalog/codegen/. Beside the modules named by a test_<module>.py here:
used: tests/runner/catalog/test_sizes.py (a source carries only the accumulators it uses) and every test that builds
  a source
index: tests/runner/catalog/test_catalog_rowblock.py (the magic-number division against integer division),
  test_index_arithmetic.py here and tests/bench/test_realworld_suite.py (no 64-bit division in a loop's PTX)
common, head, cpu: tests/runner/catalog/test_catalog.py, test_catalog_aten.py and test_catalog_rowblock.py (every
  C++ template built and verified by the harness on the CPU)
cuda: test_cuda_constructs.py, test_cuda_regs.py, test_cuda_sizes.py here and tests/runner/catalog/test_catalog.py
  (the layouts' dispatch; see codegen/cuda/__init__.py for each layout)
"""
