"""`runtime.host_copy.to_device` and the prefill path's host syncs: a prefill wave copies its
token ids, slots and lengths to the device without a stream sync, so the only sync of a
group's prefill is its first tokens' hand-off."""

from __future__ import annotations

import warnings

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.runtime.host_copy import to_device

from _eagle3_heads import saved_tiny_head
from _tiny_models import make_checkpoint


def test_to_device_keeps_values_shape_and_dtype(device):
    t = to_device([[3, 1], [4, 1]], device)
    assert t.device.type == device.type and t.dtype == torch.int64 and t.tolist() == [[3, 1], [4, 1]]
    assert to_device([], device).shape == (0,)
    assert to_device(torch.tensor([1.5, 2.5]), device, torch.float32).tolist() == [1.5, 2.5]
    assert to_device([7], "cpu").device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts CUDA stream synchronizations: needs a CUDA device (runs in scripts/gpu_check.sh)")
@pytest.mark.parametrize("drafter, temperature", [("none", 0.0), ("eagle3", 0.7)])
def test_a_prefill_wave_syncs_once_per_group(tmp_path, drafter, temperature):
    """Four prompts admitted together: their target (and draft head) prefill, first tokens and
    step state cost one synchronizing call per prefill group, its first tokens' `.tolist()`
    (greedy: an argmax; sampled: the seeded draw). Every other copy is asynchronous."""
    make_checkpoint("llama", tmp_path / "t", num_hidden_layers=4, seed=3)
    saved_tiny_head(tmp_path / "h", seed=1, capture_layers=(1, 2, 3), std=0.1)
    target = specdec.load_target(tmp_path / "t", device="cuda")
    cfg = dict(drafter="none") if drafter == "none" else dict(drafter="eagle3", max_draft_len=3, verifier="speculative")
    dec = SpecDecoder.from_pretrained(target, None if drafter == "none" else tmp_path / "h",
                                      SpecConfig(max_batch_size=4, max_seq_len=128, kv_block_size=16,
                                                 compile=False, **cfg))  # graphs, no Inductor: quick
    dec.warmup(progress=False)
    engine = dec.engine
    groups = []
    first_tokens = engine._first_tokens
    engine._first_tokens = lambda requests, *a: groups.append(len(requests)) or first_tokens(requests, *a)
    requests = [engine.submit(prompt, SamplingParams(max_new_tokens=8, temperature=temperature, seed=1))
                for prompt in ([5, 6, 7], [8, 9, 10, 11, 12], [3, 4], [1] * 20)]
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        # inference mode, as in `run_iteration`: the prefill buffers captured by `warmup` are
        # inference tensors, which may not be updated in place outside it (H200 at a699352)
        with warnings.catch_warnings(record=True) as caught, torch.inference_mode():
            warnings.simplefilter("always")
            engine._admit()
            engine._advance_prefills()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    syncs = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    states = [(r.status, r.finish_reason, r.error) for r in requests]  # a failed prefill says why
    assert len(engine.running()) == 4 and sum(groups) == 4, (groups, states)
    assert len(syncs) == len(groups), syncs
