"""Tests of bot/store/. Beside the modules named by a test_<module>.py here:
store, base, db, inbox, repos: test_jobs.py, test_units.py (on SQLite and PostgreSQL) and test_durability.py
attempts: test_units.py (a lost worker's unit, its next attempt's note and the last attempt's error)
"""
