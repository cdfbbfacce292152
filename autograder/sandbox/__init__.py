"""The sandbox side of grading: code that runs next to untrusted student code.

Only wire.py, server.py, helpers.py, tripwires.py and runner.py are visible inside the sandbox. They import
nothing from solutions/ or from the rest of autograder/.
"""
