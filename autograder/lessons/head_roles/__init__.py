"""Lesson 10_head_roles's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
