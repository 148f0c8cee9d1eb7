"""Tests of bot/, one package per package of bot/. The modules at bot/'s root:
cli: tests/runner/test_eval_cli.py and test_bench_cli.py (run through `python -m bot.cli`)
context: test_layout.py (imported by every handler's test through tests/bot/conftest.py)
demo: test_demo.py; logs: test_logs.py
"""
