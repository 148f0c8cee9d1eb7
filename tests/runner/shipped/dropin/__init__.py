"""runner/shipped/dropin/, the drop-in's parts; their tests sit one folder up, beside the other shipped scripts':
adopt, call, device, forward, guard, head, runtime, subclass: tests/runner/shipped/test_dropin_parts.py (each part imported
and called), tests/runner/harness/test_dropin*.py (the generated drop-in), tests/runner/results/test_adoption.py
"""
