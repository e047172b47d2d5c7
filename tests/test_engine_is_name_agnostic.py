"""The engine never branches on a strategy's name: engine/, the decoder, registry.py and runtime/
ask strategy objects for capabilities only.

Checked on the source (tokens and AST, so comments and docstrings do not count):
- no comparison (==, !=, in, not in) and no ``match`` whose operand reads a strategy name
  (``config.drafter``, ``config.verifier``, any ``.name``);
- no string literal equal to a registered strategy name (``"eagle3"``, ``"mtp"``, ``"greedy"``...);
- no import of a concrete strategy module (``specdec.plugins.<x>``, ``specdec.drafters``).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from specdec.registry import get_plugin_manager, strategy_names

SRC = Path(__file__).resolve().parents[1] / "src" / "specdec"
ENGINE_FILES = sorted([*(SRC / "engine").glob("*.py"), SRC / "entrypoints" / "decoder.py", SRC / "registry.py",
                       *(SRC / "runtime").glob("*.py")])
NAME_FIELDS = {"drafter", "verifier", "name"}


def _reads_name(node: ast.AST) -> bool:
    """An expression that reads a strategy name: x.drafter / x.verifier / x.name (any depth)."""
    return any(isinstance(n, ast.Attribute) and n.attr in NAME_FIELDS for n in ast.walk(node))


def name_branches(source: str, names: set[str]) -> list[str]:
    """Every place in `source` that branches on a strategy name (empty = agnostic)."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            operands = [node.left, *node.comparators]
            if any(_reads_name(o) for o in operands):
                found.append(f"line {node.lineno}: compares {ast.unparse(node)}")
        if isinstance(node, ast.Match) and _reads_name(node.subject):
            found.append(f"line {node.lineno}: match on {ast.unparse(node.subject)}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                targets = [node.module or ""]
            for target in targets:
                parts = target.split(".")
                if "drafters" in parts or ("plugins" in parts and parts[-1] != "plugins"):
                    found.append(f"line {node.lineno}: imports the strategy module {target}")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):
                continue  # f-strings
            if isinstance(value, str) and value in names:
                found.append(f"line {tok.start[0]}: strategy name literal {tok.string}")
    return found


@pytest.fixture(scope="module")
def names() -> set[str]:
    registered = strategy_names(get_plugin_manager(load_entrypoints=False))
    out = {n for kind in registered.values() for n in kind}
    assert {"none", "eagle3", "mtp", "ngram", "greedy", "target-only", "speculative", "typical"} <= out
    return out


# Literals that equal a strategy name by coincidence, one per line, with what they name instead:
# the adaptive rule's step variant "speculative" (beside "plain" and "deferred"), not the verifier.
COINCIDENCES = {"engine/adaptive.py": ['SPECULATIVE, PLAIN, DEFERRED = "speculative", "plain", "deferred"']}


@pytest.mark.parametrize("path", ENGINE_FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_engine_files_never_branch_on_a_strategy_name(path, names):
    source = path.read_text()
    for line in COINCIDENCES.get(str(path.relative_to(SRC)), []):
        assert source.count(line) == 1, f"{line!r} is listed as a coincidence but not found once"
        source = source.replace(line, "pass")  # same line count: the reported lines stay true
    assert name_branches(source, names) == []


def test_the_checker_catches_each_kind_of_name_branch(names):
    bad = {
        'if config.drafter == "mtp":\n    pass\n': "compares",
        "x = self.config.verifier != 'typical'\n": "compares",
        'ok = strategies.drafter.name in ("a", "b")\n': "compares",
        "match config.verifier:\n    case _:\n        pass\n": "match on",
        'KIND = "ngram"\n': "strategy name literal",
        "from .plugins.mtp import NAME\n": "imports the strategy module",
        "from specdec.drafters.mtp_drafter import MTPDrafter\n": "imports the strategy module",
    }
    for source, what in bad.items():
        found = name_branches(source, names)
        assert found and what in found[0], (source, found)
    ok = (
        '"""The docstring may say drafter="mtp"."""\n'
        "from .plugins import BUILTIN_PLUGINS\n"
        "n = strategies.drafter.num_tree_slots\n"
        'msg = f"drafter={config.drafter!r}"\n'
        "options[config.drafter] = {}\n"
    )
    assert name_branches(ok, names) == []
