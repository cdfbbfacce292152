"""Lesson 06's source evidence, as the grader reads it: the rules live in autograder/source_rules.py
(standard library only), which `release` also copies beside the lesson's notebook, so that its visible
tests refuse first, with the same message, what the grader refuses here."""
from autograder import source_rules


def problem(sources):
    """None when the sources show a triton_attention that launches a Triton kernel; else why not."""
    return source_rules.triton_problem(sources)


def softmax_problem(sources):
    """None when the sources show a triton_softmax that launches a Triton kernel; else why not."""
    return source_rules.softmax_problem(sources)


def flash_problem(sources):
    """None unless flash_attention, or anything it reaches by name in the cells, calls fused attention."""
    return source_rules.flash_problem(sources)


def online_problem(sources):
    """None unless online_softmax, or anything it reaches by name in the cells, calls PyTorch's softmax."""
    return source_rules.online_problem(sources)
