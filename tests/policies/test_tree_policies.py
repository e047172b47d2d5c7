"""Tree policies (`specdec.policies`, hook `specdec_tree_policy`): static choices validation,
the EAGLE-1 default tree, unknown names, the trees every built-in grows (valid, within budget,
of the declared shape), EAGLE-2 against brute force, whole i.i.d. groups for `sampled`,
lossless greedy decoding through `SpecDecoder` under each policy and drafter, and third-party
policies (a test plugin's, and the example plugin's `binary`) used by unchanged drafters.

Trees are grown over the conformance kit's table "draft model" (`specdec.testing.oracles.
PathTable`); end-to-end runs use the kit's tiny random target and heads, with the ops' torch
references on CPU (`references_on_cpu`: interpreted Triton is ~1000x slower per row).
"""

import importlib
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec import SamplingParams, SpecConfig
from specdec.config import ConfigError
from specdec.entrypoints.decoder import SpecDecoder
from specdec.hookspecs import hookimpl
from specdec.policies import EAGLE1_DEFAULT, DynamicPolicy, FrontierPolicy, SampledPolicy, StaticPolicy, group_sizes
from specdec.registry import UnknownStrategyError, VerifierCaps, get_plugin_manager, resolve_tree_policy
from specdec.testing.check_drafters import builtin_options, tiny_target
from specdec.testing.kit import references_on_cpu
from specdec.testing.oracles import PathTable, assert_follows, naive_dynamic
from specdec.testing.strategies import choices

from _readme import readme_policy_plugin

pytestmark = pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing")  # random heads, by design

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "third_party_plugin"
GREEDY_VERIFIER = VerifierCaps(lossless=True, needs_draft_probs=False, greedy_only=True)
SAMPLING_VERIFIER = VerifierCaps(lossless=True, needs_draft_probs=True, greedy_only=False)


def pm():
    return get_plugin_manager(load_entrypoints=False)


def policy_for(verifier=GREEDY_VERIFIER, **config):
    return resolve_tree_policy(SpecConfig(max_seq_len=256, **config), verifier, pm())


def static_config(paths, *, budget=None, depth=None):
    return dict(tree="static", max_draft_len=depth or max(len(p) for p in paths),
                max_total_draft_tokens=budget or len(paths), plugin_options={"static": {"choices": paths}})


def grow(policy, table, B, *, seed=0, roots=None):
    """Grow one batch over `table`; returns (grown, expand) (expand.calls records each call)."""
    roots = torch.arange(B) if roots is None else roots  # [B] root path hashes
    expand = table.expander(roots, sample=policy.samples, generator=torch.Generator().manual_seed(seed))
    return policy.grow(expand, B, "cpu"), expand


def row(grown, b):
    """(n, parents, tokens) of row b with the root as node 0 (parent -1, token 0)."""
    return int(grown.num_nodes[b]), [-1] + grown.parents[b].tolist(), [0] + grown.tokens[b].tolist()


# ----------------------------------------------------------------------------- static choices
@pytest.mark.parametrize("paths, budget, depth, message", [
    ([[0], [0, 1, 0]], None, 3, r"path \[0, 1, 0\] lacks its prefix \[0, 1\]; paths must be prefix-closed"),
    ([[1]], None, 1, None),  # skipping ranks is allowed: [1] alone is prefix-closed
    ([[0], [1], [0]], 5, 1, r"path \[0\] appears twice"),
    ([[0], [1], [0, 0], [0, 1]], 3, 2, r"has 4 paths; max_total_draft_tokens=3 allows at most 3"),
    ([[0], [0, 0], [0, 0, 0]], 3, 2, r"path \[0, 0, 0\] is 3 deep; max_draft_len=2 allows at most 2"),
    ([[0], ["a"]], None, 1, r"path \['a'\] has rank 'a'; allowed: ints in \[0, 63\]"),
    ([[0], [64]], None, 1, r"path \[64\] has rank 64; allowed: ints in \[0, 63\]"),
    ([[0], [-1]], None, 1, r"rank -1; allowed: ints in \[0, 63\]"),
    ([[0], [True]], None, 1, r"rank True; allowed: ints in \[0, 63\]"),
    ([[0], []], None, 1, r"every path is a non-empty list of candidate ranks, got \[\]"),
    ([[0], 1], None, 1, r"every path is a non-empty list of candidate ranks, got 1"),
    ([], 1, 1, r"must be a non-empty list of paths like \[\[0\], \[1\], \[0, 0\]\], got \[\]"),
])
def test_static_choices_are_validated_with_errors_naming_the_bad_value(paths, budget, depth, message):
    config = dict(tree="static", max_draft_len=depth, max_total_draft_tokens=budget or max(1, len(paths)),
                  plugin_options={"static": {"choices": paths}})
    if message is None:
        assert policy_for(**config).tree.paths == ((1,),)
        return
    with pytest.raises(ConfigError, match=message) as err:
        policy_for(**config)
    assert "plugin_options['static']['choices']" in str(err.value)  # names where the bad value came from


def test_static_options_and_topk_are_checked():
    with pytest.raises(ConfigError, match=r"plugin_options\['static'\] has unknown keys \['paths'\]; allowed: \['choices', 'file'\]"):
        policy_for(tree="static", plugin_options={"static": {"paths": [[0]]}})
    with pytest.raises(ConfigError, match="topk=2 does not apply to tree='static'"):
        policy_for(tree="static", topk=2)


def test_static_choices_can_come_from_a_json_file(tmp_path):
    (tmp_path / "tree.json").write_text('{"choices": [[0], [1], [0, 0]]}')
    policy = policy_for(tree="static", max_draft_len=2, max_total_draft_tokens=3,
                        plugin_options={"static": {"file": str(tmp_path / "tree.json")}})
    assert policy.tree.paths == ((0,), (1,), (0, 0))
    (tmp_path / "bad.json").write_text("[[0], [1, 1]]")
    with pytest.raises(ConfigError, match=r"tree choices file .*bad.json: path \[1, 1\] lacks its prefix \[1\]"):
        policy_for(tree="static", max_draft_len=2, max_total_draft_tokens=3,
                   plugin_options={"static": {"file": str(tmp_path / "bad.json")}})
    with pytest.raises(ConfigError, match="does not exist"):
        policy_for(tree="static", plugin_options={"static": {"file": str(tmp_path / "missing.json")}})
    with pytest.raises(ConfigError, match="'choices' or 'file', not both"):
        policy_for(tree="static", plugin_options={"static": {"file": "x", "choices": [[0]]}})


def test_static_alone_uses_the_eagle1_default_tree_cut_to_the_budget():
    policy = policy_for(tree="static")  # max_draft_len=5, max_total_draft_tokens=5
    assert isinstance(policy, StaticPolicy)
    assert policy.tree.paths == ((0,), (1,), (2,), (3,), (0, 0)) and policy.num_nodes == 5
    full = policy_for(tree="static", max_total_draft_tokens=25)
    assert full.tree.paths == tuple(sorted(EAGLE1_DEFAULT, key=lambda p: (len(p), p))) and full.depth == 5
    assert full.widths == (1, 4, 4, 1, 1) and full.children == (4, 3, 3, 3, 2)  # nodes with children per depth


@given(depth=st.integers(1, 6), budget=st.integers(1, 40))
def test_the_default_tree_is_a_prefix_closed_cut_of_eagle1(depth, budget):
    policy = policy_for(tree="static", max_draft_len=depth, max_total_draft_tokens=budget)
    want = [p for p in EAGLE1_DEFAULT if len(p) <= depth][:budget]
    assert sorted(policy.tree.paths) == sorted(want) and policy.num_nodes == len(want)
    assert all(p[:-1] in set(want) for p in want if len(p) > 1)


def test_unknown_tree_names_fail_listing_the_installed_ones():
    with pytest.raises(UnknownStrategyError, match=r"tree='eagle9' is not provided by any plugin; "
                                                   r"available: \['dynamic', 'linear', 'sampled', 'static'\]"):
        policy_for(tree="eagle9")


def test_a_greedy_only_policy_is_refused_for_a_verifier_needing_draft_probs():
    class ByValue(FrontierPolicy):  # keeps candidates by value: speculative sampling would be biased
        def __init__(self):
            super().__init__((1,), (2,), 2, samples=False, name="by-value")

        def _select(self, scores):  # [B, 2]: keep both candidates
            return torch.arange(2, device=scores.device).expand(scores.shape[0], -1)

    manager = pm()
    manager.register(_policy_plugin("by-value", lambda config, verifier: ByValue()))
    config = SpecConfig(tree="by-value", max_total_draft_tokens=2, max_seq_len=64)
    assert isinstance(resolve_tree_policy(config, GREEDY_VERIFIER, manager), ByValue)
    with pytest.raises(ConfigError, match=r"needs draft probabilities, but tree='by-value' keeps candidates by their value"):
        resolve_tree_policy(config, SAMPLING_VERIFIER, manager)


# ----------------------------------------------------------------------------- grown trees
@st.composite
def builtin_configs(draw):
    """A config of a random built-in policy, and whether the verifier needs draft probabilities."""
    name = draw(st.sampled_from(["linear", "dynamic", "sampled", "static"]))
    D = draw(st.integers(1, 4))
    if name == "linear":
        config = dict(tree=name, max_draft_len=D)
    elif name == "static":
        config = static_config(draw(choices(max_nodes=12, max_depth=D)))
    else:
        K = draw(st.integers(1, 3))
        config = dict(tree=name, topk=K, max_draft_len=D, max_total_draft_tokens=draw(st.integers(D, D * K)))
    return config, draw(st.booleans())


@given(case=builtin_configs(), B=st.integers(1, 3), seed=st.integers(0, 2**16), ties=st.booleans())
def test_every_builtin_grows_valid_trees_of_its_declared_shape(case, B, seed, ties):
    config, needs_probs = case
    policy = policy_for(SAMPLING_VERIFIER if needs_probs else GREEDY_VERIFIER, **config)
    note(repr(policy))
    assert policy.samples >= needs_probs  # a verifier needing draft probabilities gets i.i.d. draws
    table = PathTable(max(8, max(policy.children)), seed, integer=ties)
    grown, expand = grow(policy, table, B, seed=seed)
    assert [(c["width"], c["k"]) for c in expand.calls] == list(zip(policy.widths, policy.children))
    S = policy.num_nodes
    assert grown.tokens.shape == grown.parents.shape == (B, S) and grown.num_nodes.shape == (B,)
    assert S <= config.get("max_total_draft_tokens", config["max_draft_len"])
    for b in range(B):
        n, par, tok = row(grown, b)
        assert n == S  # table rows have no -inf: every slot is filled
        depth = [0] * (n + 1)
        for i in range(1, n + 1):
            assert 0 <= par[i] < i, f"row {b}: node {i} has parent {par[i]}"
            depth[i] = depth[par[i]] + 1
        assert max(depth) <= policy.depth
        if not policy.samples:
            assert len({(par[i], tok[i]) for i in range(1, n + 1)}) == n, "greedy siblings must be distinct tokens"
    if isinstance(policy, StaticPolicy) and not policy.samples and not ties:
        assert _paths_by_rank(grown, expand, table, 0) == sorted(policy.tree.paths, key=lambda p: (len(p), p))


def _paths_by_rank(grown, expand, table, b):
    """Row b's nodes as choices paths: the rank of each node among its parent's candidates."""
    rank = {}
    for call in expand.calls:
        for f, h in enumerate(call["hashes"][b].tolist()):
            for j, x in enumerate(call["cand"].tokens[b, f].tolist()):
                rank.setdefault((h, x), j)
    n, par, tok = row(grown, b)
    h, paths = [b] + [0] * n, [()] + [None] * n
    for i in range(1, n + 1):
        h[i] = table.child(h[par[i]], tok[i])
        paths[i] = paths[par[i]] + (rank[(h[par[i]], tok[i])],)
    return sorted(paths[1:], key=lambda p: (len(p), p))


@given(K=st.integers(1, 4), D=st.integers(1, 4), B=st.integers(1, 3), seed=st.integers(0, 2**16),
       ties=st.booleans(), data=st.data())
def test_dynamic_keeps_the_best_path_scores_like_a_brute_force_eagle2(K, D, B, seed, ties, data):
    budget = data.draw(st.integers(D, D * K))
    policy = policy_for(tree="dynamic", topk=K, max_draft_len=D, max_total_draft_tokens=budget)
    assert isinstance(policy, DynamicPolicy)
    table = PathTable(data.draw(st.integers(K, 24)), seed, integer=ties)
    grown, expand = grow(policy, table, B)
    for b in range(B):
        tokens, parents, frontiers = naive_dynamic(table, b, K, D, budget)
        assert [c["hashes"][b].tolist() for c in expand.calls] == frontiers  # the K best of each depth
        assert grown.tokens[b].tolist() == tokens and grown.parents[b].tolist() == parents


@given(D=st.integers(1, 4), K=st.integers(1, 4), B=st.integers(1, 3), seed=st.integers(0, 2**16), data=st.data())
def test_sampled_keeps_whole_iid_groups_and_expands_the_best_draw(D, K, B, seed, data):
    budget = data.draw(st.integers(D, D * K))
    policy = policy_for(SAMPLING_VERIFIER, tree="sampled", topk=K, max_draft_len=D, max_total_draft_tokens=budget)
    sizes = group_sizes(budget, D, K)
    assert isinstance(policy, SampledPolicy) and policy.children == sizes and sum(sizes) == budget
    table = PathTable(12, seed)
    grown, expand = grow(policy, table, B, seed=seed)
    for b in range(B):
        toks, par, didx = grown.tokens[b].tolist(), grown.parents[b].tolist(), grown.dist_index[b].tolist()
        h, score, parent, first = b, torch.tensor(0.0), 0, 0  # score: float32 path log-probability
        for t, c in enumerate(sizes):
            group = range(first, first + c)
            assert [par[i] for i in group] == [parent] * c, f"row {b}: depth {t} is not one whole group"
            logq = table.logq(torch.tensor(h))  # [V] the expanded node's draft distribution
            assert torch.equal(grown.dists[b, t], logq.exp()), f"row {b}: dists row {t}"
            scores = [score + logq[toks[i]] for i in group]
            best = max(range(c), key=lambda j: (float(scores[j]), -j))  # ties -> the first draw
            expanded = [i for i in group if didx[i] >= 0]
            assert expanded == ([first + best] if t + 1 < D else []), f"row {b}: depth {t} expands {expanded}"
            h, score, parent, first = table.child(h, toks[first + best]), scores[best], first + best + 1, first + c


def test_sampled_groups_are_iid_draws_of_the_draft_distribution():
    policy = policy_for(SAMPLING_VERIFIER, tree="sampled", topk=3, max_draft_len=2, max_total_draft_tokens=5)
    table = PathTable(6, seed=3, scale=1.0)
    n = 20_000
    with references_on_cpu("cpu"):  # 20k rows: the ranking's PyTorch body (test_ranked_call compares the kernel)
        grown, _ = grow(policy, table, n, roots=torch.zeros(n, dtype=torch.int64))
    group = grown.tokens[:, :3]  # [n, 3] the root's group
    law = table.logq(torch.tensor(0)).exp()
    for j in range(3):
        assert_follows(group[:, j], law, f"draw {j} of the root's group")
    pairs = group[:, 0] * 6 + group[:, 1]  # independence: the joint law of two draws is the product
    assert_follows(pairs, (law[:, None] * law[None, :]).flatten(), "two draws of one group jointly")


# ----------------------------------------------------------------------------- end to end
FIELDS = dict(max_batch_size=2, max_seq_len=96, kv_block_size=4, compile=False, cuda_graphs=False)
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8, 9, 7], [30]]
BINARY_DEPTH3 = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1], [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1],
                 [1, 0, 0], [1, 0, 1], [1, 1, 0], [1, 1, 1]]
TREES = {
    "static-eagle1": dict(tree="static", max_draft_len=5, max_total_draft_tokens=25),
    "static-binary": static_config(BINARY_DEPTH3),
    "static-target-only": dict(tree="static", max_draft_len=3, max_total_draft_tokens=8, verifier="target-only"),
    "sampled-speculative": dict(tree="sampled", topk=2, max_draft_len=3, max_total_draft_tokens=5, verifier="speculative"),
    "dynamic": dict(tree="dynamic", topk=2, max_draft_len=3, max_total_draft_tokens=6),
    "linear-speculative": dict(tree="linear", max_draft_len=3, verifier="speculative", max_total_draft_tokens=3),
}
SAMPLES = {"sampled-speculative", "linear-speculative"}  # the n-gram drafter has no draft distribution to sample
CASES = [(d, t) for d in ("eagle3", "mtp", "ngram") for t in TREES if not (d == "ngram" and t in SAMPLES)]


@pytest.fixture(scope="module")
def target():
    return tiny_target("cpu")


@pytest.fixture(scope="module")
def target_only(target):
    with references_on_cpu("cpu"):
        dec = SpecDecoder(target, SpecConfig(**FIELDS))
        return generate(dec)


def generate(dec, new=20):
    with references_on_cpu("cpu"):
        return dec.generate(PROMPTS, SamplingParams(max_new_tokens=new, ignore_eos=True))


def decoder(target, drafter, manager=None, **config):
    options = {**builtin_options(drafter), **config.pop("plugin_options", {})}
    with references_on_cpu("cpu"):
        return SpecDecoder(target, SpecConfig(**FIELDS, drafter=drafter, plugin_options=options, **config), pm=manager)


def assert_lossless(results, target_only, what):
    got, want = [r.token_ids for r in results], [r.token_ids for r in target_only]
    assert got == want, f"{what}: {got} != target-only {want}"
    taus = [r.stats.mean_accept_length for r in results]
    assert all(t is not None and t >= 1.0 for t in taus), f"{what}: tau={taus}"
    return sum(sum(r.stats.accepted_per_step) for r in results)


@pytest.mark.parametrize("drafter, tree", CASES)
def test_greedy_output_equals_target_only_under_each_policy(target, target_only, drafter, tree):
    config = dict(TREES[tree])
    dec = decoder(target, drafter, **config)
    assert dec.strategies.tree_policy.num_nodes == config["max_total_draft_tokens"]
    accepted = assert_lossless(generate(dec), target_only, f"drafter={drafter} {tree}")
    if drafter == "ngram":  # its drafts are accepted on the tiny model's output: the comparison is not vacuous
        assert accepted > 0, f"drafter=ngram {tree}: no draft accepted"


# ----------------------------------------------------------------------------- third-party policies
def _policy_plugin(name, make):
    """A plugin object declaring tree=`name`, built by `make(config, verifier)`."""

    class Plugin:
        @hookimpl
        def specdec_strategy_names(self):
            return {"tree": [name]}

        @hookimpl
        def specdec_tree_policy(self, config, verifier):
            return make(config, verifier) if config.tree == name else None

    return Plugin()


class CombPolicy(FrontierPolicy):
    """A test policy: `width` children of the root, then a chain under the best one."""

    def __init__(self, width, depth, *, samples):
        super().__init__((1,) * depth, (width,) + (1,) * (depth - 1), width + depth - 1, samples=samples, name="comb")
        self.grows = 0

    def grow(self, expand, batch, device):
        self.grows += 1
        return super().grow(expand, batch, device)

    def _pick(self, t, score):  # score [B, F_t * K_t]: the best candidate goes on
        return score.argmax(-1, keepdim=True)

    def _select(self, scores):  # [B, M]: keep all
        return torch.arange(scores.shape[1], device=scores.device).expand(scores.shape[0], -1)


def test_a_third_party_policy_is_used_by_the_eagle3_drafter_unchanged(target, target_only):
    made = []

    def make(config, verifier):
        made.append(CombPolicy(3, config.shape.max_draft_len, samples=verifier.needs_draft_probs))
        return made[-1]

    manager = pm()
    manager.register(_policy_plugin("comb", make))
    dec = decoder(target, "eagle3", manager, tree="comb", max_draft_len=3, max_total_draft_tokens=5)
    assert dec.strategies.tree_policy is made[-1] and dec.strategies.drafter.num_tree_slots == 6
    assert_lossless(generate(dec), target_only, "tree='comb'")
    assert made[-1].grows > 0, "the drafter never grew a tree with the plugin's policy"
    with pytest.raises(UnknownStrategyError, match="tree='comb' is not provided"):
        decoder(target, "eagle3", pm(), tree="comb", max_draft_len=3, max_total_draft_tokens=5)


@pytest.fixture
def example_plugin(monkeypatch):
    """The example plugin module `specdec_top2`, imported from examples/ (not installed)."""
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN))
    sys.modules.pop("specdec_top2", None)
    yield importlib.import_module("specdec_top2")
    sys.modules.pop("specdec_top2", None)


def test_the_example_binary_policy_validates_its_options(example_plugin):
    manager = pm()
    manager.register(example_plugin)
    policy = resolve_tree_policy(SpecConfig(tree="binary", max_draft_len=3, max_total_draft_tokens=14), pm=manager)
    assert isinstance(policy, example_plugin.BinaryPolicy) and policy.widths == (1, 2, 4) and policy.num_nodes == 14
    with pytest.raises(ConfigError, match=r"depth 3 has 14 nodes; max_total_draft_tokens=13 is too small \(allowed: >= 14\)"):
        resolve_tree_policy(SpecConfig(tree="binary", max_draft_len=3, max_total_draft_tokens=13), pm=manager)
    with pytest.raises(ConfigError, match=r"\['depth'\]=4 is not allowed; allowed: ints in \[1, 3\]"):
        resolve_tree_policy(SpecConfig(tree="binary", max_draft_len=3, max_total_draft_tokens=30,
                                       plugin_options={"binary": {"depth": 4}}), pm=manager)


@pytest.mark.parametrize("drafter, verifier", [("eagle3", "greedy"), ("ngram", "greedy"), ("mtp", "speculative")])
def test_the_example_binary_policy_decodes_losslessly(target, target_only, example_plugin, drafter, verifier):
    manager = pm()
    manager.register(example_plugin)
    dec = decoder(target, drafter, manager, tree="binary", verifier=verifier, max_draft_len=3, max_total_draft_tokens=14,
                  plugin_options={"binary": {"depth": 3}})
    assert isinstance(dec.strategies.tree_policy, example_plugin.BinaryPolicy)
    assert dec.strategies.tree_policy.samples == (verifier == "speculative")
    assert_lossless(generate(dec), target_only, f"tree='binary' drafter={drafter} verifier={verifier}")


def test_the_readme_binary_policy_decodes_losslessly(target, target_only):
    """The README's copy of the example policy ("Write a tree policy", read from README.md),
    registered as a user would, drafts trees through the EAGLE-3 drafter losslessly."""
    plugin = readme_policy_plugin()
    assert plugin.specdec_strategy_names() == {"tree": ["binary"]}
    manager = pm()
    manager.register(plugin)
    dec = decoder(target, "eagle3", manager, tree="binary", max_draft_len=3, max_total_draft_tokens=14)
    assert type(dec.strategies.tree_policy).__module__ == "readme_binary_policy"
    assert_lossless(generate(dec), target_only, "the README's tree='binary'")


@given(D=st.integers(1, 5), B=st.integers(1, 3), samples=st.booleans(),
       logq=st.lists(st.sampled_from([0.0, -0.5, -3.0, float("-inf"), float("nan"), float("inf")]), min_size=15, max_size=15),
       seed=st.integers(0, 2**16))
def test_the_chains_own_glue_grows_the_tree_the_generic_glue_grows(D, B, samples, logq, seed):
    """`LinearPolicy` skips the generic gathers and `assemble` (`_chain_next`, `_chain_finish`):
    for any candidates, -inf / NaN / +inf log-probabilities included (a chain cut short), it
    grows the same tree, draft-distribution rows included, as the generic frontier glue."""
    import specdec.policies.frontier as frontier
    from specdec.policies import LinearPolicy
    from specdec.types import Candidates

    gen = torch.Generator().manual_seed(seed)
    calls = [(torch.randint(0, 50, (B, 1, 1), generator=gen),
              torch.tensor([logq[(3 * t + b) % 15] for b in range(B)]).view(B, 1, 1),
              torch.rand(B, 1, 7, generator=gen) if samples else None) for t in range(D)]

    def expand(fr):
        tok, lq, probs = calls[fr.depth]
        return Candidates(tokens=tok, logq=lq, probs=probs)

    trees = []
    for generic in (False, True):
        policy = LinearPolicy(D, samples=samples)
        if generic:
            policy._next_frontier, policy._finish = frontier._next_frontier, frontier._finish
        trees.append(policy.grow(expand, B, "cpu"))
    chain, want = trees
    for field in ("tokens", "parents", "num_nodes", "dist_index", "dists"):
        a, b = getattr(chain, field), getattr(want, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert torch.equal(a, b), (field, a, b)
