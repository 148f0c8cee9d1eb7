"""Tests of bot/web/. Beside the modules named by a test_<module>.py here:
server: test_worker.py, test_load.py and tests/bot/features/test_handlers.py (webhooks, /healthz, /metrics)
metrics: tests/bot/features/test_handlers.py (`/metrics`)
"""
