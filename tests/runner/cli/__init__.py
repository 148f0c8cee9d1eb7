"""Tests of runner/cli/. Beside the modules named by a test_<module>.py here:
worker: tests/runner/test_worker_alive.py and tests/bot/web/test_runner_api.py (leasing, heartbeats, the sandbox check)
worker_settings: tests/test_deploy.py and tests/runner/cli/test_worker.py (the settings the manifests and the worker use)
"""
