"""The course's instructor tools: release student copies, grade submissions safely, and the
hidden-test checks behind both. `python -m autograder --help` lists the commands."""
