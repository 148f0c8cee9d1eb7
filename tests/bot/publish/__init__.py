"""Tests of bot/publish/. Beside the modules named by a test_<module>.py here:
propose: tests/bot/github/test_local_platform.py (the flow on a real git repository)
verdicts: test_body.py, test_checks.py and test_comments.py (one target's table, verdict line and environment line in
  each text)
deliver, notify (beside test_notify.py): tests/bot/github/test_github_platform.py and
tests/bot/features/test_kernel_jobs.py (the outbox delivering to the fake GitHub)
"""
