"""Tests of runner/shipped/, the scripts a PR ships, imported and called as modules:
bench, dropin_tests, rewrite_tests: test_shipped.py
"""
