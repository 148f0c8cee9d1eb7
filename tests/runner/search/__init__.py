"""Tests of runner/search/. Beside the modules named by a test_<module>.py here:
pool, evaluation, trace, types: test_loop.py and tests/runner/proposers/llm/test_population.py, test_overlap.py (the
  population, its shares and credit, evaluation overlapping proposals, the resumable trace)
cutoff: test_deadline.py (a chunk still in evaluation when the budget runs out is cut off)
"""
