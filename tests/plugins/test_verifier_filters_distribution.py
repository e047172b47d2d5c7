"""Every lossless sampling verifier plugin applies every sampling filter: the first emitted
token follows the filtered target law, with temperature, top-k, top-p and min-p each alone
and all combined, through the plugin object the engine calls (its `probs_for` + walk),
not only the ops (test_sampling_distribution.py checks the walks on unfiltered laws).

Setup: V = 12 categories, a chain root -> x1; the root's target logits `LOGITS` are fixed
(distinct values, so no filter boundary is a tie); target-only drafts every token as x1
(rows cycle through the vocabulary, excluded tokens included), speculative drafts x1 from
q = 0.5 softmax(LOGITS) + 0.5 uniform (mass on excluded tokens). Truth: `naive_probs` of
_naive_probs.py (the filters written the obvious way, float64).

Threshold. n = 2^21 trials (8 calls of 2^18 rows), K = 12:
    tau = 1/2 sqrt((K - 1) / n) + sqrt(ln(1/delta) / (2n)) + eps = 0.00115 + 0.00181 + 0.0001 = 0.0031
with delta = 1e-6 (McDiarmid: a correct verifier fails with probability < 1e-6) and eps for
float32 probabilities. A verifier whose law is off by TV = 0.01 (a 1% bias) gives, with
probability > 1 - 1e-3, an empirical TV >= 0.01 - 0.00115 - sqrt(ln(1e3)/(2n)) = 0.0076,
2.5 times tau: caught. The cases are built so that dropping any filter (or applying min-p
before temperature, or top-p before top-k) moves the law by TV >= 0.19, 60 times tau;
`test_the_cases_make_every_filter_matter` checks that, and planted verifiers that drop a
filter fail the same assertion even at n = 2^15.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from specdec import SpecConfig
from specdec.ops import build_tree
from specdec.registry import get_plugin_manager
from specdec.types import SamplingTensors, TreeMeta

from _mtp_heads import e2e_cpu  # noqa: F401  (a fixture)
from _naive_probs import naive_probs

pytestmark = pytest.mark.usefixtures("e2e_cpu")

V = 12
LOGITS = [2.2, -0.6, 3.0, 0.5, 1.5, -1.0, 2.6, 0.9, -0.2, 1.9, 0.2, 1.2]
DELTA, EPS = 1e-6, 1e-4
ROWS, CALLS = 2**18, 8  # n = 2^21
N_TRIALS = ROWS * CALLS

FILTERS = {  # (temperature, top_k, top_p, min_p)
    "temperature": (0.5, 0, 1.0, 0.0),
    "top_k": (1.0, 3, 1.0, 0.0),
    "top_p": (1.0, 0, 0.6, 0.0),
    "min_p": (1.0, 0, 1.0, 0.3),
    "combined": (2.5, 6, 0.7, 0.35),  # top-p binds only after top-k's renormalization; min-p after temperature
}


def tv_bound(n: int, k: int = V) -> float:
    return 0.5 * math.sqrt((k - 1) / n) + math.sqrt(math.log(1 / DELTA) / (2 * n)) + EPS


def tv(a, b) -> float:
    return 0.5 * sum(abs(x - y) for x, y in zip(a, b))


def _renorm(q):
    s = sum(q)
    return [x / s for x in q]


def _restrict(law, keep):
    return _renorm([x if k > 0 else 0.0 for x, k in zip(law, keep)])


def buggy_laws(t, k, p, m) -> dict[str, list[float]]:
    """What a verifier with one filter dropped or misordered would sample."""
    out = {}
    if t != 1.0:
        out["temperature dropped"] = naive_probs(LOGITS, 1.0, k, p, m)
    if k:
        out["top-k dropped"] = naive_probs(LOGITS, t, 0, p, m)
    if p < 1:
        out["top-p dropped"] = naive_probs(LOGITS, t, k, 1.0, m)
    if m > 0:
        out["min-p dropped"] = naive_probs(LOGITS, t, k, p, 0.0)
    if m > 0 and t != 1.0:
        out["min-p before temperature"] = _restrict(naive_probs(LOGITS, t, k, p, 0.0), naive_probs(LOGITS, 1.0, 0, 1.0, m))
    if k and p < 1:
        out["top-p before top-k"] = _restrict(naive_probs(LOGITS, t, k, 1.0, m), naive_probs(LOGITS, t, 0, p, 0.0))
    return out


@pytest.mark.parametrize("name", FILTERS)
def test_the_cases_make_every_filter_matter(name):
    t, k, p, m = FILTERS[name]
    truth = naive_probs(LOGITS, t, k, p, m)
    for bug, law in buggy_laws(t, k, p, m).items():
        if name == "combined" and bug == "min-p dropped":
            continue  # min-p's cut is inside top-p's here; its order against temperature is what the case checks
        assert tv(truth, law) >= 0.19, (name, bug, tv(truth, law))
    assert tv_bound(N_TRIALS) < 0.0031


def _verifier(name: str):
    verifier = get_plugin_manager().hook.specdec_verify(config=SpecConfig(verifier=name))
    assert verifier is not None and verifier.lossless
    return verifier


def _sampling(rows: int, t, k, p, m) -> SamplingTensors:
    return SamplingTensors(
        temperature=torch.full((rows,), float(t)), top_k=torch.full((rows,), int(k), dtype=torch.int64),
        top_p=torch.full((rows,), float(p)), min_p=torch.full((rows,), float(m)),
    )


def first_tokens(verifier, params, *, rows: int, calls: int, seed: int) -> torch.Tensor:
    """[rows * calls] first emitted tokens of the chain root -> x1 through `verifier`."""
    g = torch.Generator().manual_seed(seed)
    one = build_tree(torch.tensor([[-1, 0]]), torch.tensor([2]), impl="torch")
    tree = TreeMeta(*(getattr(one, f)[0].expand(rows, *getattr(one, f).shape[1:]).contiguous()
                      for f in ("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index")))
    logits = torch.stack([torch.tensor(LOGITS), torch.randn(V, generator=g)]).expand(rows, 2, V).contiguous()
    q0 = 0.5 * torch.softmax(torch.tensor(LOGITS, dtype=torch.float64), -1) + 0.5 / V  # [V]
    draft_probs = torch.stack([q0, torch.full((V,), 1.0 / V, dtype=torch.float64)]).float().expand(rows, 2, V).contiguous()
    sampling = _sampling(rows, *params)
    out = []
    for _ in range(calls):
        tokens = torch.zeros(rows, 2, dtype=torch.int64)
        if verifier.needs_draft_probs:
            tokens[:, 1] = torch.multinomial(q0, rows, replacement=True, generator=g)
        else:
            tokens[:, 1] = (torch.arange(rows) + int(torch.randint(V, (1,), generator=g))) % V
        uniforms = torch.rand(rows, 2, 2, generator=g, dtype=torch.float64)
        kw = {"draft_probs": draft_probs} if verifier.needs_draft_probs else {}
        acc = verifier(tokens, tree, logits, sampling, uniforms=uniforms, **kw)
        out.append(acc.accept_tokens[:, 0].clone())
    return torch.cat(out)


def assert_follows(samples: torch.Tensor, truth: list[float], what: str) -> float:
    n = samples.numel()
    empirical = torch.bincount(samples, minlength=V).double() / n
    distance = tv(empirical.tolist(), truth)
    tau = tv_bound(n)
    assert distance <= tau, f"{what}: TV={distance:.5f} > tau={tau:.5f} (n={n}, delta={DELTA})"
    return distance


@pytest.mark.parametrize("name", FILTERS)
@pytest.mark.parametrize("verifier_name", ["target-only", "speculative"])
def test_first_token_through_the_verifier_plugin_follows_the_filtered_target(verifier_name, name):
    verifier = _verifier(verifier_name)
    params = FILTERS[name]
    samples = first_tokens(verifier, params, rows=ROWS, calls=CALLS, seed=zlib.crc32(f"{verifier_name}/{name}".encode()))
    truth = naive_probs(LOGITS, *params)
    excluded = [i for i in range(V) if truth[i] == 0]
    assert not any(int((samples == i).sum()) for i in excluded), f"{name}: a filtered-out token was emitted"
    assert_follows(samples, truth, f"{verifier_name} with {name}")


class DropsAFilter:
    """A planted bug: the plugin called with one filter switched off."""

    def __init__(self, verifier, field: str):
        self.inner, self.field = verifier, field
        self.needs_draft_probs, self.lossless = verifier.needs_draft_probs, True

    def __call__(self, tokens, tree, logits, sampling, **kw):
        off = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}[self.field]
        changed = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p)
        changed[self.field] = torch.full_like(changed[self.field], off)
        return self.inner(tokens, tree, logits, SamplingTensors(**changed), **kw)


@pytest.mark.parametrize("field", ["temperature", "top_k", "top_p", "min_p"])
@pytest.mark.parametrize("verifier_name", ["target-only", "speculative"])
def test_a_verifier_plugin_that_drops_a_filter_fails_the_test(verifier_name, field):
    broken = DropsAFilter(_verifier(verifier_name), field)
    samples = first_tokens(broken, FILTERS[field], rows=2**15, calls=1, seed=3)
    with pytest.raises(AssertionError, match="TV="):
        assert_follows(samples, naive_probs(LOGITS, *FILTERS[field]), f"{verifier_name} without {field}")


def test_a_one_percent_bias_inside_the_support_fails_the_test():
    """The claim of the module docstring, run: the real plugin's samples, each replaced with
    probability 1.25% by the least likely token the filters keep (TV from the truth >= 1%),
    are refused at the full n; the unbiased ones pass. Here that token has probability 0.2, so
    a replacement rate of 1.25% moves TV(law, truth) to 1.25% * (1 - 0.2) = 1.0%."""
    params = FILTERS["combined"]
    truth = naive_probs(LOGITS, *params)
    rare = min((p, i) for i, p in enumerate(truth) if p > 0)[1]
    eps = 0.0125
    assert eps * (1 - truth[rare]) >= 0.01 - 1e-9  # the bias's TV from the truth
    samples = first_tokens(_verifier("target-only"), params, rows=ROWS, calls=CALLS, seed=11)
    assert_follows(samples, truth, "unbiased")
    flip = torch.rand(samples.shape, generator=torch.Generator().manual_seed(12)) < eps
    biased = torch.where(flip, torch.full_like(samples, rare), samples)
    with pytest.raises(AssertionError, match="TV="):
        assert_follows(biased, truth, "biased by 1%")
