"""drafter="eagle3" with sampling, end to end through `SpecDecoder.generate`: the generated
tokens follow the target's distribution (after temperature, top-k, top-p, min-p), for chains
and dynamic trees, with the target-only and the speculative verifier.

The truth is the exact joint law of the first 3 tokens, enumerated with transformers on the
same weights (4-token vocabulary: 64 outcomes) and filtered per step by
`specdec.ops.sampling_probs` (whose filters are checked against a naive filter in
test_sampling_probs.py).
"""

import pytest
import torch

from specdec import SamplingParams, SpecConfig
from specdec.entrypoints.decoder import SpecDecoder
from specdec.drafters.eagle3_checkpoint import save_eagle3
from specdec.models import load_target
from specdec.ops import sampling_probs

from _eagle3_heads import random_head
from _mtp_heads import e2e_cpu, tv_bound, tv_distance  # noqa: F401  (e2e_cpu is a fixture)
from _tiny_models import make_checkpoint

pytestmark = pytest.mark.usefixtures("e2e_cpu")

V = 4
PROMPT = [1, 3, 2, 0]
STEPS = 3  # the first token comes from the prefill, the next ones from speculative steps
SAMPLES = 2000
B = 40


@pytest.fixture(scope="module")
def tiny_vocab_target_and_head(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_vocab")
    hf = make_checkpoint("llama", folder, seed=2, vocab_size=V, initializer_range=0.3)
    head = tmp_path_factory.mktemp("head")
    save_eagle3(
        random_head(seed=5, vocab_size=V, draft_vocab_size=V, hidden_size=64, target_hidden_size=64, head_dim=16,
                    capture_layers=(0, 1, 2), std=0.3),
        head,
    )
    return load_target(folder), hf, head


def exact_joint(hf, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """Law of the first STEPS tokens sampled from the target with `params`' filters."""
    law = {(): 1.0}
    p = params
    for _ in range(STEPS):
        prefixes = list(law)
        with torch.no_grad():
            logits = hf(torch.tensor([PROMPT + list(x) for x in prefixes])).logits[:, -1].float()
        n = len(prefixes)
        probs = sampling_probs(
            logits,
            torch.full((n,), float(p.temperature)),
            torch.full((n,), int(p.top_k), dtype=torch.int64),
            torch.full((n,), float(p.top_p)),
            torch.full((n,), float(p.min_p)),
        ).double()
        law = {pre + (t,): law[pre] * float(probs[i, t]) for i, pre in enumerate(prefixes) for t in range(V)}
    return law


CASES = [
    ("target-only", dict(tree="linear", max_draft_len=3), SamplingParams(temperature=1.0)),
    ("speculative", dict(tree="linear", max_draft_len=3), SamplingParams(temperature=0.8, top_p=0.9)),
    ("target-only", dict(tree="dynamic", topk=2, max_draft_len=2), SamplingParams(temperature=1.2, top_k=3)),
    ("speculative", dict(tree="dynamic", topk=2, max_draft_len=2), SamplingParams(temperature=1.0, min_p=0.1)),
]


@pytest.mark.parametrize("verifier, shape, params", CASES, ids=["target-only-chain", "speculative-chain-top-p", "target-only-tree-top-k", "speculative-tree-min-p"])
def test_sampled_eagle3_output_follows_the_target_distribution(tiny_vocab_target_and_head, verifier, shape, params):
    """n = 2000 draws of the first 3 tokens (64 outcomes). Bound, derived in `tv_bound`:
    0.5 * sum sqrt(p(1-p)/n) plus the McDiarmid term sqrt(ln(1e6)/(2n)) = 0.059; under 0.1
    here, false alarm < 1e-6. A verifier that skips rejection fails it (see
    test_verify_sampling.py / test_sampling_distribution.py for the op-level versions)."""
    target, hf, head = tiny_vocab_target_and_head
    config = SpecConfig(drafter="eagle3", verifier=verifier, max_batch_size=B, max_seq_len=32, kv_block_size=4, **shape)
    dec = SpecDecoder.from_pretrained(target, head, config, seed=7)
    params = SamplingParams(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
        max_new_tokens=STEPS, ignore_eos=True,
    )
    samples, accepted = [], 0
    for _ in range(SAMPLES // B):
        for out in dec.generate([PROMPT] * B, params):
            samples.append(tuple(out.token_ids))
            accepted += sum(out.stats.accepted_per_step)
    assert accepted > 0.1 * SAMPLES  # drafts were really accepted: the acceptance path is exercised
    truth = exact_joint(hf, params)
    tv, bound = tv_distance(samples, truth), tv_bound(truth, SAMPLES)
    assert bound < 0.1
    assert tv < bound, f"TV={tv:.3f} >= {bound:.3f}"
