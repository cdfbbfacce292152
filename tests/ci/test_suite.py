"""The suite's own configuration: pyproject.toml's testpaths list every folder of tests, so none is left out of a
plain `pytest` (it lists them to order them, the largest first)."""

from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(tomllib is None, reason="tomllib is Python 3.11's")
def test_testpaths_name_every_folder_of_tests():
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"][
        "testpaths"
    ]
    folders = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")}
    assert folders <= set(testpaths), f"not in pyproject.toml's testpaths: {sorted(folders - set(testpaths))}"
