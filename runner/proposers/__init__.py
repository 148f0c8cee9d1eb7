"""Proposers for the search loop: the LLM proposer (llm.py) and, later, the builtin strategy catalog."""
