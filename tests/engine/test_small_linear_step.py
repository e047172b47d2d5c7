"""`ExecutionConfig.small_linear`: the few-row projection kernel (`kernels.small_linear`) in a
decoder's target and draft head. Greedy speculative output still equals target-only output token
for token (fp32), and the kernel really runs the step's projections: on CUDA, or on the CPU in
Triton's interpreter (where F.linear otherwise runs, and always runs without the interpreter)."""

from __future__ import annotations

import pytest
import torch

import specdec
import specdec.kernels.small_linear as small_linear
import specdec.models.linear as linear_module
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.models.linear import Linear

from _mtp_heads import e2e_cpu  # noqa: F401  (a fixture)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PROMPTS = [[5, 17, 33], [71, 4]]
BASE = dict(max_batch_size=2, max_seq_len=64, kv_block_size=4, compile=False, cuda_graphs=False)
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning")]


@pytest.fixture
def kernel_on_cpu(monkeypatch, request):
    """On CPU: the other ops on their torch references (`e2e_cpu`), the small-linear kernel alone in
    Triton's interpreter (conftest made every kernel an interpreted one), so the test times the
    projections, not the whole step, in the interpreter. On CUDA nothing changes."""
    request.getfixturevalue("e2e_cpu")
    if not CUDA:
        monkeypatch.setattr(linear_module, "use_triton", lambda impl, x: True)
        # one SM's tiles (64 columns a program): a few interpreted programs a call, not one per H100 SM
        monkeypatch.setattr(small_linear, "_num_sms", lambda device: 1)


def _generate(target_folder, head, small: bool, calls: list, **cfg) -> list[list[int]]:
    target = specdec.load_target(target_folder, device=DEVICE)
    dec = SpecDecoder.from_pretrained(target, head, SpecConfig(**BASE, **cfg, small_linear=small))
    linears = [m for root in (target.model, *dec.strategies.drafter_caps.modules) for m in root.modules()
               if isinstance(m, Linear)]
    assert linears and all(m.small_rows is small for m in linears)
    before = len(calls)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (7, 5)]
    out = [r.token_ids for r in dec.generate(PROMPTS, params)]
    if small:
        assert len(calls) > before, "no projection ran through the small-linear kernel"
    return out


def test_speculative_output_equals_target_only_with_the_small_linear_kernel(request, kernel_on_cpu, monkeypatch):
    calls = []
    kernel = linear_module.small_linear_triton

    def counted(x, w, b):
        calls.append(tuple(x.shape))
        return kernel(x, w, b)

    monkeypatch.setattr(linear_module, "small_linear_triton", counted)
    llama = request.getfixturevalue("tiny_llama8")
    head = request.getfixturevalue("tiny_eagle3_head")
    plain = _generate(llama, None, True, calls, drafter="none")
    chain = _generate(llama, head, True, calls, drafter="eagle3", max_draft_len=3)
    tree = _generate(llama, head, True, calls, drafter="eagle3", tree="dynamic", topk=2, max_draft_len=2,
                     max_total_draft_tokens=3)
    assert chain == plain and tree == plain
    assert max(rows for rows, _ in calls) <= 8  # more rows (prefill) are GEMMs: F.linear


def test_the_switch_is_off_by_default_and_a_bool():
    assert SpecConfig().execution.small_linear is False
    with pytest.raises(specdec.config.ConfigError, match=r"small_linear='on' is not allowed; allowed: True, False"):
        SpecConfig(small_linear="on")
