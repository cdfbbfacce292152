"""Lesson 05_kv_cache's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
