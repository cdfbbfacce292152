"""Lesson 08_kv_compression's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
