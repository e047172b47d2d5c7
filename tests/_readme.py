"""The README's Python examples, read from README.md itself (tests/test_readme.py and the tree-policy suite run them)."""

from __future__ import annotations

import re
import types
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(containing: str) -> str:
    """The README's one ```python block with a line containing `containing`."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"README.md has {len(found)} python blocks containing {containing!r}"
    return found[0]


def readme_policy_plugin() -> types.ModuleType:
    """The README's tree-policy example ("Write a tree policy") as a plugin module, as `pip install` would expose it."""
    module = types.ModuleType("readme_binary_policy")
    exec(compile(python_block("class BinaryPolicy(FrontierPolicy)"), "README: tree policy", "exec"), module.__dict__)
    return module
