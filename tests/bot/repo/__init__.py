"""Tests of bot/repo/: each module has its test_<module>.py here."""
