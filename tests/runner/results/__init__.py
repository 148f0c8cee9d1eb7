"""Tests of runner/results/. Beside the modules named by a test_<module>.py here:
dropin_test: tests/runner/harness/test_dropin.py (the generated test module run against the drop-in)
shapes: tests/runner/results/test_proposal.py (the example module described as the harness verified it)
"""
