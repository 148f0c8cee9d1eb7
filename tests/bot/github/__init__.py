"""Tests of bot/github/. Beside the modules named by a test_<module>.py here:
client: test_github_platform.py (every request of the App and the Action goes through it)
platform: test_local_platform.py and test_github_platform.py (its two implementations, and its markers)
patch (beside test_patch.py): test_github_platform.py and test_local_platform.py (a fork's PR gets the patch)
routing: tests/bot/features/test_handlers.py (every feature's router, composed)
"""
