"""Lesson 03_multi_head's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
