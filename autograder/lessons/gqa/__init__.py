"""Lesson 04_gqa's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
