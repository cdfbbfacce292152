"""The corpus of honest habits (tests/harness/honest.py), whose runs grade each lesson in its own file."""

from tests.harness.honest import test_the_corpus_is_large_enough  # noqa: F401 - collected here, once
