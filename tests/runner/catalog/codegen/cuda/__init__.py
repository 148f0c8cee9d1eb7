"""Tests of runner/catalog/codegen/cuda/ live one folder up (tests/runner/catalog/codegen/) and in tests/runner/catalog/:
cluster, columns, common, flat, grid, onchip, params, prelude, rows, split, totals: tests/runner/catalog/test_catalog.py
  (every CUDA_CASES set rendered and compiled with nvcc; the GPU cases verified on the H100), test_catalog_flat.py,
  test_catalog_strided.py and test_catalog_rowblock.py (flat, bcast and strided kernels on the emulated GPU), and
  tests/runner/catalog/codegen/test_cuda_constructs.py and test_cuda_sizes.py (every layout against the module's
  forward on the emulated GPU; one kernel serving other sizes)
regs: tests/runner/catalog/codegen/test_cuda_regs.py (emulated GPU, nvcc, the one-load PTX check) and
  test_cuda_regs_gpu.py (H100)
rope: tests/runner/catalog/codegen/test_cuda_rope.py (the suite's RoPE problems on the emulated GPU, bf16 bit-exact;
  vector loads only and no 64-bit division in the PTX)
"""
