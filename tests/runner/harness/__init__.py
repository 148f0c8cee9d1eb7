"""Tests of runner/harness/. Beside the modules named by a test_<module>.py here:
bwrap: test_sandbox.py and test_build.py (every confined process, its view, its namespaces, its whole tree killed)
checks, plan, reference, trials, config: test_evaluator.py, test_contestants.py and test_oracle.py (the stages the
  evaluator runs, through its public methods)
dropin: test_dropin.py, test_dropin_cache.py, test_dropin_forward.py, test_dropin_guard.py, test_dropin_runtime.py
  (the generated drop-in run for real: its parts, runner/shipped/dropin/, as one module), test_launch_plan.py (a
  drop-in with device code, without a GPU) and test_dropin_cuda.py (gpu: it runs from the cubin)
clocked: test_measure.py (the parent's bound, the escape ratio and the batch sizing, on injected measurements)
compile_cache: test_sandbox.py (a judge's compile cache keyed by every file it may read; a hostile reference's file
  reaches no other problem's judge)
"""
