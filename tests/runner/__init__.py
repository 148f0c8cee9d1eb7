"""Tests of runner/, mirroring its packages. Beside the modules named by a test_<module>.py in the mirrored folder:
errors: harness/test_problem.py and harness/test_faults.py (ProblemError and MachineError as raised and reported)
shipped: shipped/test_shipped.py (render: the docstring, the per-PR block and the resolver replaced, nothing else),
  shipped/test_dropin_parts.py (the drop-in's parts called as modules)
dtypes: tests/test_layout.py (the ABI's dtype codes: one source for the C header, the harness, the catalog and the
  drop-in guard)
"""
