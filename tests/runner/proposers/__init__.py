"""Tests of runner/proposers/. Beside the modules named by a test_<module>.py here:
catalog: tests/runner/catalog/test_catalog.py, test_catalog_aten.py and test_catalog_suite.py (the catalog proposer's
  ideas and candidates, verified by the harness)
"""
