"""Lesson 09_flash_backward's grader: its hidden checks (checks.py), known mistakes (mistakes.py) and reference
probes (probes.py)."""
