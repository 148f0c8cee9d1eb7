"""Tests of bot/features/. Beside the modules named by a test_<module>.py here:
labels, commands, checks, installations, triggers, status: test_handlers.py and test_conversation.py (their events
posted, signed, to the real app) and test_kernel_jobs.py (benchmark and hygiene jobs started by commands and the nightly run)
"""
