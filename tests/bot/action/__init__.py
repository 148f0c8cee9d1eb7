"""Tests of bot/action/. Beside the modules named by a test_<module>.py here:
settings: test_entry.py (settings refused before anything starts, triggers read from real event payloads)
"""
