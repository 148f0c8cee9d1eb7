"""Tests of runner/proposers/llm/. Beside the modules named by a test_<module>.py here:
client, facts: test_proposer.py, test_prompts.py and test_repair.py (requests to the scripted server, what the prompt
  tells the model)
"""
