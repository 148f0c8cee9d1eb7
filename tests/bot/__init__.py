"""Tests of bot/, one package per package of bot/. The modules at bot/'s root:
cli: test_cli.py, and tests/runner/cli/ (eval, optimize and bench, run through `python -m bot.cli`)
context: test_layout.py (imported by every handler's test through tests/bot/conftest.py)
demo: test_demo.py; logs: test_logs.py
"""
