"""Tests of runner/harness/procs/. Beside the modules named by a test_<module>.py here:
process: tests/runner/harness/test_process.py (spawning, limits, the log tail, killing the tree)
abi, contestant, calls: tests/runner/harness/test_evaluator.py, test_contestants.py and test_faults.py (the
  child processes behind every verdict; the judge too)
batch: test_judge.py (the judge's steps) and tests/runner/harness/test_evaluator.py (the parent-clocked batches
  behind every accepted time, and the hacks they catch)
probe: tests/runner/harness/test_faults.py (a machine error only when the known-good probe fails too)
"""
