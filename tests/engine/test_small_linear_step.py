"""`ExecutionConfig.small_linear`: the few-row projection kernels (`kernels.small_linear`, and
`kernels.fused_linear` with the norm or SwiGLU's activation before a projection) in a decoder's
target and draft heads. Greedy speculative output still equals target-only output token for token
(fp32), with every projection of 1-8 rows through those kernels, the norms and activations fused:
on CUDA the kernels; on the CPU the same path (`models.linear`'s choices, the model's fused
wiring: which rows, the residual sums, the captured states) with each kernel's PyTorch reference,
and one short run through the interpreted kernels themselves (~0.1 s a launch there; the kernels
are compared with their references in tests/kernels)."""

from __future__ import annotations

import pytest
import torch

import specdec
import specdec.kernels.fused_linear as fused_linear
import specdec.kernels.small_linear as small_linear
import specdec.models.linear as linear_module
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.models.linear import Linear

from _mtp_heads import e2e_cpu, random_mtp  # noqa: F401  (a fixture)

# models.linear's kernel entry points -> their references (same signatures)
KERNELS = {"small_linear_triton": small_linear.small_linear_torch,
           "norm_linear_triton": fused_linear.norm_linear_torch,
           "rms_norm_linear_triton": fused_linear.rms_norm_linear_torch,
           "swiglu_linear_triton": fused_linear.swiglu_linear_torch}
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PROMPTS = [[5, 17, 33], [71, 4]]
BASE = dict(max_batch_size=2, max_seq_len=64, kv_block_size=4, compile=False, cuda_graphs=False)
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning")]


@pytest.fixture
def few_rows_path(monkeypatch, request):
    """The few-row path on: on CPU `models.linear` takes it as on CUDA (off CUDA it keeps F.linear),
    the other ops on their torch references (`e2e_cpu`). Returns the list every kernel call is
    recorded in, (name, rows); on CPU each call runs the kernel's reference unless the test asks
    for the interpreted kernels (`request.param` "interpreted")."""
    request.getfixturevalue("e2e_cpu")
    interpreted = getattr(request, "param", "") == "interpreted"
    if not CUDA:
        monkeypatch.setattr(linear_module, "use_triton", lambda impl, x: True)
        # one SM's tiles (64 columns a program): a few interpreted programs a call, not one per H100 SM
        monkeypatch.setattr(small_linear, "_num_sms", lambda device: 1)
        if interpreted:
            monkeypatch.setenv("TRITON_INTERPRET", "1")  # e2e_cpu turned the other kernels off
    calls = []
    for name, reference in KERNELS.items():
        run = getattr(linear_module, name) if CUDA or interpreted else reference

        def counted(x, *args, _name=name, _run=run):
            calls.append((_name, x.shape[0]))
            return _run(x, *args)

        monkeypatch.setattr(linear_module, name, counted)
    return calls


def _generate(target_folder, head, small: bool, calls: list, lengths=(7, 5), **cfg) -> list[list[int]]:
    target = specdec.load_target(target_folder, device=DEVICE)
    dec = SpecDecoder.from_pretrained(target, head, SpecConfig(**BASE, **cfg, small_linear=small))
    linears = [m for root in (target.model, *dec.strategies.drafter_caps.modules) for m in root.modules()
               if isinstance(m, Linear)]
    assert linears and all(m.small_rows is small for m in linears)
    before = len(calls)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths]
    out = [r.token_ids for r in dec.generate(PROMPTS, params)]
    assert (len(calls) > before) == small, "the few-row kernels ran exactly when the switch was on"
    return out


def test_speculative_output_equals_target_only_with_the_few_row_kernels(request, few_rows_path):
    calls = few_rows_path
    llama = request.getfixturevalue("tiny_llama8")
    head = request.getfixturevalue("tiny_eagle3_head")
    plain = _generate(llama, None, True, calls, drafter="none")
    # every layer's norms and SwiGLU run fused with their projections: add+norm before qkv and gate/up,
    # the first layer's norm (no add) before qkv, the activation before down; o_proj and the head plain
    assert {name for name, _ in calls} == set(KERNELS)
    chain = _generate(llama, head, True, calls, drafter="eagle3", max_draft_len=3)
    tree = _generate(llama, head, True, calls, drafter="eagle3", tree="dynamic", topk=2, max_draft_len=2,
                     max_total_draft_tokens=3)
    mtp = _generate(llama, random_mtp(seed=0), True, calls, drafter="mtp", max_draft_len=3)
    assert chain == plain and tree == plain and mtp == plain
    assert max(rows for _, rows in calls) <= 2  # where the kernels win; more rows (verify, prefill): F.linear
    # the same tokens with the switch off (F.linear and the separate pieces): the fused path computes
    # what the model computes (fp32: the kernels' sums differ in the last bits, not these tokens)
    assert _generate(llama, None, False, calls, drafter="none") == plain


@pytest.mark.skipif(CUDA, reason="on CUDA the test above runs the kernels themselves")
@pytest.mark.parametrize("few_rows_path", ["interpreted"], indirect=True)
def test_the_interpreted_kernels_decode_what_their_references_decode(request, few_rows_path):
    # an MTP chain: its draft forwards (2 rows, one a request) run all four kernels; the target's
    # verify (6 rows) is F.linear's
    calls = few_rows_path
    llama = request.getfixturevalue("tiny_llama8")
    kernels = _generate(llama, random_mtp(seed=0), True, calls, lengths=(2, 2), drafter="mtp", max_draft_len=2)
    assert {name for name, _ in calls} == set(KERNELS)
    assert kernels == _generate(llama, random_mtp(seed=0), False, calls, lengths=(2, 2), drafter="mtp",
                                max_draft_len=2)


def test_the_switch_is_off_by_default_and_a_bool():
    assert SpecConfig().execution.small_linear is False
    with pytest.raises(specdec.config.ConfigError, match=r"small_linear='on' is not allowed; allowed: True, False"):
        SpecConfig(small_linear="on")
