"""Tests of runner/proposers/rewrite/: each module has its test_<module>.py here (test_proposer_gpu.py: on CUDA)."""
