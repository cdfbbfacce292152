"""Lesson 01_attention's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
