"""The conformance kit (`specdec.testing`, `specdec check`): the built-in strategies pass every
property it has for them, the example plugin's tree policy passes through its entry point, and
planted bugs (a verifier accepting one token too many, a policy with non-topological parents,
a copy of the example plugin with an off-by-one) fail, naming the property.

Small profile: the `ci` example counts scaled down (at least one example per property); the
distribution properties keep their full sample sizes, so their thresholds stay the kit's.
"""

import importlib
import io
import sys
from pathlib import Path

import pytest
import torch

from specdec import Acceptance
from specdec.entrypoints.cli import main as specdec_main
from specdec.hookspecs import hookimpl
from specdec.plugins import greedy
from specdec.policies import DynamicPolicy
from specdec.registry import get_plugin_manager
from specdec.testing import check

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "third_party_plugin"
SMALL = 0.2  # x the ci profile's examples
BINARY = {"max_draft_len": 3, "max_total_draft_tokens": 14}  # a config the example's `binary` accepts


def run(names, *, pm=None, config=None, scale=SMALL, only=None, shrink=True):
    """`check(...)` with its table captured: (results, table text)."""
    out = io.StringIO()
    results = check(names, pm=pm or get_plugin_manager(load_entrypoints=False), config=config, scale=scale, out=out,
                    only=only, shrink=shrink)
    return results, out.getvalue()


def failures(results):
    return [f"{r.subject} / {r.prop}: {r.error}" for r in results if not r.ok]


# ----------------------------------------------------------------------------- built-ins pass
@pytest.mark.parametrize("names", [["linear", "static"], ["dynamic", "sampled"], ["target-only", "speculative"],
                                   ["build-tree", "relocate-kv"], ["ngram"]])
def test_builtin_strategies_pass_every_property(names):
    results, table = run(names)
    print(table)
    assert {r.subject for r in results} == set(names), table
    assert results and not failures(results), table
    assert f"{len(results)} passed, 0 failed" in table


def test_the_kit_checks_what_each_kind_promises():
    results, _ = run(["dynamic", "static", "speculative"], scale=0.0, only="no-such-property")
    assert results == []  # `only` filters by property name
    from specdec.testing import Subject, properties_for

    names = {p.name for p in properties_for(Subject("dynamic", "tree-policy", obj=DynamicPolicy(2, 2, 3)))}
    assert "dynamic keeps exactly the K best path scores of each depth (brute force)" in names
    assert "every tree is topological, within the budget, with clean padding" in names
    assert not any("static" in n for n in names)  # static-only properties skip other policies


def test_specdec_check_runs_from_the_command_line(capsys):
    assert specdec_main(["check", "greedy"]) == 0
    table = capsys.readouterr().out
    assert "greedy rows accept exactly what a brute-force greedy walk accepts" in table and "0 failed" in table
    assert specdec_main(["check", "no-such-strategy"]) == 2
    assert "unknown strategy names ['no-such-strategy']; installed:" in capsys.readouterr().err


# ----------------------------------------------------------------------------- planted bugs fail
class OneTooMany:
    """The greedy verifier, then one more node: the first child of the last accepted node."""

    lossless, needs_draft_probs, greedy_only = True, False, True

    def __init__(self):
        self.inner = greedy.GreedyVerifier()

    def __call__(self, tokens, tree, target_logits, sampling, *, uniforms=None, draft_probs=None):
        acc = self.inner(tokens, tree, target_logits, sampling, uniforms=uniforms, draft_probs=draft_probs)
        B = tokens.shape[0]
        rows = torch.arange(B, device=tokens.device)
        child = tree.next_token[rows, acc.accept_nodes[rows, acc.accept_length]]  # [B] -1 = a leaf
        more = child >= 0  # [B] bool
        length = acc.accept_length + more.long()  # [B]
        nodes, out = acc.accept_nodes.clone(), acc.accept_tokens.clone()
        r, c, n = rows[more], child[more], length[more]
        nodes[r, n] = c
        out[r, n - 1] = tokens[r, c]
        out[r, n] = target_logits[r, c].argmax(-1)  # the bonus at the extra node
        return Acceptance(accept_length=length, accept_nodes=nodes, accept_tokens=out)


class Reversed(DynamicPolicy):
    """EAGLE-2, its nodes then listed deepest first: parents come after their children."""

    def grow(self, expand, batch, device):
        grown = super().grow(expand, batch, device)
        S = grown.tokens.shape[1]
        parents = torch.where(grown.parents > 0, S + 1 - grown.parents, grown.parents).flip(-1)  # [B, S]
        return type(grown)(grown.tokens.flip(-1), parents, grown.num_nodes, grown.dist_index, grown.dists)


class Planted:
    """A plugin providing the planted strategies under their own names."""

    @hookimpl
    def specdec_strategy_names(self):
        return {"verifier": ["one-too-many"], "tree": ["reversed"]}

    @hookimpl
    def specdec_verify(self, config):
        return OneTooMany() if config.verifier == "one-too-many" else None

    @hookimpl
    def specdec_tree_policy(self, config, verifier):
        return Reversed(2, 3, 5) if config.tree == "reversed" else None


def planted_pm():
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Planted())
    return pm


def test_a_verifier_accepting_one_token_too_many_fails_the_brute_force_walk():
    results, table = run(["one-too-many"], pm=planted_pm(), scale=0.4, shrink=False)
    verdict = {r.prop: r for r in results}
    walk = verdict["greedy rows accept exactly what a brute-force greedy walk accepts"]
    assert not walk.ok and "accept_length" in walk.error, table
    assert verdict["acceptance is a path of the tree carrying its tokens, then one bonus token"].ok  # a subtle bug


def test_a_policy_with_non_topological_parents_fails():
    results, table = run(["reversed"], pm=planted_pm(), only="topological", shrink=False)
    assert [(r.prop, r.ok) for r in results] == [("every tree is topological, within the budget, with clean padding", False)]
    assert "not topological" in results[0].error, table
    assert "FAIL" in table and "0 passed, 1 failed" in table


# ----------------------------------------------------------------------------- the example plugin
def test_the_example_plugins_tree_policy_passes_through_its_entry_point(installed_example_plugin):
    results, table = run(["binary"], pm=get_plugin_manager(), config=BINARY, scale=0.5)
    assert {r.subject for r in results} == {"binary"} and len(results) >= 6, table
    assert not failures(results), table


def _buggy_copy(tmp_path, monkeypatch):
    """A copy of the example plugin named `binary-bug`, whose policy keeps history nodes 1..M
    (off by one: the first node is dropped, the last kept twice)."""
    source = (EXAMPLE_PLUGIN / "specdec_top2" / "__init__.py").read_text()
    good = "return torch.arange(scores.shape[1], device=scores.device).expand(scores.shape[0], -1)"
    bad = "return (torch.arange(scores.shape[1], device=scores.device) + 1).clamp(max=scores.shape[1] - 1).expand(scores.shape[0], -1)"
    assert source.count(good) == 1 and source.count('"binary"') >= 3, "the example changed: update the planted bug"
    folder = tmp_path / "specdec_binary_bug"
    folder.mkdir()
    (folder / "__init__.py").write_text(source.replace(good, bad).replace('"binary"', '"binary-bug"').replace('"top2"', '"top2-bug"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("specdec_binary_bug", None)
    return importlib.import_module("specdec_binary_bug")


def test_a_planted_bug_in_a_copy_of_the_example_plugin_fails_naming_the_property(tmp_path, monkeypatch):
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(_buggy_copy(tmp_path, monkeypatch))
    results, table = run(["binary-bug"], pm=pm, config=BINARY, only="topological", shrink=False)
    assert [r.ok for r in results] == [False], table
    row = next(line for line in table.splitlines() if line.startswith("binary-bug"))
    assert "every tree is topological, within the budget, with clean padding" in row and "FAIL" in row
    sys.modules.pop("specdec_binary_bug", None)
