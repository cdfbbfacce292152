"""Lesson 07_head_specialization's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
