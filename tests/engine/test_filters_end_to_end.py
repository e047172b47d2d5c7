"""Sampling filters survive the whole path: through `SpecDecoder.generate` (request params ->
the engine's sampling tensors -> prefill sampling and the verifier plugin), no emitted token
is ever one the filters remove, for every lossless sampling verifier installed, with top-k,
top-p and min-p each alone and all combined (with temperature).

Why support and not a distribution test: end to end, samples are expensive (a generate of
40 short requests takes about a second on the CPU), so a TV test could only catch large
biases; the filtered law itself is checked to 1% through the plugins with 2^21 draws in
test_verifier_filters_distribution.py. What this file adds is the plumbing, and for that a
support test has no false alarm (the truth gives an excluded token probability 0) and
great power: a path that drops a filter emits an excluded token at a checked position with
probability m_i (the mass the filter removes there, 0.2 to 0.3 on average here), so it
survives all checked positions with probability prod(1 - m_i) <= exp(-sum m_i); each case
asserts that bound is below 1e-6 for every single dropped filter, on its own samples.

Target: a bigram Llama (V = 8, spread-out distributions) with the MTP head that predicts
it exactly (`_mtp_heads`), so most drafts are accepted and the filters act on acceptance,
residual and bonus alike. Truth: the exact next-token logits of every sampled prefix from
transformers on the same weights, filtered by `naive_probs` (_naive_probs.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.models import load_target
from specdec.registry import get_plugin_manager, strategy_names

from _mtp_heads import bigram_oracle_mtp, e2e_cpu, make_bigram_checkpoint  # noqa: F401  (e2e_cpu: a fixture)
from _naive_probs import naive_probs

pytestmark = pytest.mark.usefixtures("e2e_cpu")

V = 8
PROMPT = [1, 3, 2, 0]
NEW = 3
BATCH, CALLS = 36, 7  # 252 requests per verifier: 42 per single filter, 126 combined
CASES = {  # (temperature, top_k, top_p, min_p)
    "top_k": (1.0, 2, 1.0, 0.0),
    "top_p": (1.0, 0, 0.5, 0.0),
    "min_p": (1.0, 0, 1.0, 0.5),
    "combined": (1.5, 3, 0.7, 0.4),  # each of the three cuts first at some contexts (dropped alone: mass 0.06)
}
MIX = ["top_k", "top_p", "min_p", "combined", "combined", "combined"]  # the cases of one call, in turn
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}


def lossless_sampling_verifiers() -> list[str]:
    pm = get_plugin_manager()
    found = []
    for name in strategy_names(pm).get("verifier", []):
        verifier = pm.hook.specdec_verify(config=SpecConfig(verifier=name))
        if verifier is not None and verifier.lossless and not getattr(verifier, "greedy_only", False):
            found.append(name)
    return sorted(found)


VERIFIERS = lossless_sampling_verifiers()


def test_the_built_in_lossless_sampling_verifiers_are_all_checked():
    assert {"target-only", "speculative"} <= set(VERIFIERS)


@pytest.fixture(scope="module")
def bigram_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("filters_target")
    hf = make_bigram_checkpoint(folder, seed=1, vocab_size=V, initializer_range=0.3)
    return dict(target=load_target(folder), hf=hf, runs={})


def run(bigram_runs, verifier: str):
    """{case: [token lists]} and the draft tokens accepted, generated once per verifier:
    every call mixes the cases as MIX does (the combined one needs more samples for its power)."""
    if verifier not in bigram_runs["runs"]:
        config = SpecConfig(drafter="mtp", verifier=verifier, max_draft_len=2, max_batch_size=BATCH,
                            max_seq_len=16, kv_block_size=4)
        dec = SpecDecoder.from_pretrained(bigram_runs["target"], bigram_oracle_mtp(vocab_size=V), config, seed=1)
        names = [MIX[i % len(MIX)] for i in range(BATCH)]
        params = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m, max_new_tokens=NEW, ignore_eos=True)
                  for t, k, p, m in (CASES[n] for n in names)]
        samples, accepted = {n: [] for n in CASES}, 0
        for _ in range(CALLS):
            for i, out in enumerate(dec.generate([PROMPT] * BATCH, params)):
                assert out.stats.finish_reason == "length"
                samples[names[i]].append(out.token_ids)
                accepted += sum(out.stats.accepted_per_step)
        bigram_runs["runs"][verifier] = samples, accepted
    return bigram_runs["runs"][verifier]


def next_logits(hf, prefixes: list[tuple[int, ...]]) -> dict[tuple[int, ...], list[float]]:
    """The target's next-token logits after PROMPT + each prefix (one forward per prefix length)."""
    out = {}
    for n in sorted({len(p) for p in prefixes}):
        group = [p for p in prefixes if len(p) == n]
        with torch.no_grad():
            logits = hf(torch.tensor([PROMPT + list(p) for p in group])).logits[:, -1].double()
        out.update({p: row.tolist() for p, row in zip(group, logits)})
    return out


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("verifier", VERIFIERS)
def test_no_token_the_filters_remove_is_ever_emitted(bigram_runs, verifier, case):
    samples, accepted = run(bigram_runs, verifier)
    assert accepted > BATCH * CALLS / 2  # drafts were accepted: the acceptance path saw the filters too
    t, k, p, m = CASES[case]
    prefixes = sorted({tuple(s[:j]) for s in samples[case] for j in range(NEW)})
    logits = next_logits(bigram_runs["hf"], prefixes)
    removed_mass = {f: 0.0 for f in ("top_k", "top_p", "min_p") if (k, p, m)[("top_k", "top_p", "min_p").index(f)] != OFF[f]}
    for s in samples[case]:
        for j in range(NEW):
            row = logits[tuple(s[:j])]
            law = naive_probs(row, t, k, p, m)
            assert law[s[j]] > 0, f"{verifier}/{case}: token {s[j]} at position {j} after {s[:j]} is filtered out"
            for f in removed_mass:  # what a path that dropped filter f would emit outside the support
                kw = dict(top_k=k, top_p=p, min_p=m)
                kw[f] = OFF[f]
                dropped = naive_probs(row, t, kw["top_k"], kw["top_p"], kw["min_p"])
                removed_mass[f] += sum(q for q, keep in zip(dropped, law) if keep == 0)
    for f, mass in removed_mass.items():
        assert math.exp(-mass) < 1e-6, f"{case}: dropping {f} would go unnoticed with probability {math.exp(-mass):.2g}"
