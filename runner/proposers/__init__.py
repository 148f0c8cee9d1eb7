"""Proposers for the search loop: the builtin catalog (catalog.py), the LLM (llm/), source rewrites of the user's module
(rewrite/) and the example seed (seed.py)."""
