"""Tests of runner/shipped/, the scripts a PR ships, imported and called as modules:
bench, dropin_tests, rewrite_tests: test_shipped.py
dropin (the drop-in's parts, and what runner/harness/dropin.py keeps of each): test_dropin_parts.py
"""
