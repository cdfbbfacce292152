"""Lesson 06_gpu's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
