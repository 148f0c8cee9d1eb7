"""Proposers for the search loop: the builtin catalog (catalog.py), the LLM (llm/) and the example seed (seed.py)."""
