"""Source rewrites: the user's module made faster by rewriting its PyTorch source, no kernel.

proposer.py (the proposer and `rewrites`), source.py (what a module file shows), match.py (finding sites),
rules.py, activations.py, attention.py, copies.py (the rewrites), edit.py (minimal text edits of the file).
"""
