"""`StepState`, the one record of every per-slot tensor a step touches: the drafter's own
per-slot tensors ride in it (`drafter`), a bucket's views slice them with the rest, the
engine's state holds a head drafter's very tensors (its prefill writes them, its `propose`
reads them from the state), and a state without them is a clear error, not a silent read
of other tensors."""

from __future__ import annotations

import pytest
import torch

from specdec import SpecConfig, SpecDecoder
from specdec.step_state import StepState

from _eagle3_heads import saved_tiny_head
from _mtp_heads import e2e_cpu  # noqa: F401
from _tiny_models import make_checkpoint

pytestmark = pytest.mark.usefixtures("e2e_cpu")


def test_a_bucket_slices_the_drafters_tensors_with_the_rest_and_writes_land_in_the_state():
    slots = {"ctx": torch.zeros(4, 3), "live": torch.zeros(4, dtype=torch.bool)}
    state = StepState.allocate(4, 5, 2, device="cpu", hidden_dtype=torch.float32, drafter=slots)
    bucket = state.rows(2)
    assert bucket.drafter["ctx"].shape == (2, 3) and bucket.accept_tokens.shape == (2, 5)
    bucket.drafter["live"][1] = True
    bucket.drafter["ctx"][0] += 1.5
    assert slots["live"].tolist() == [False, True, False, False]  # the drafter's own tensors, not copies
    assert slots["ctx"][0].tolist() == [1.5] * 3


@pytest.mark.parametrize("bad, why", [({"ctx": torch.zeros(2, 3)}, r"'ctx' is \(2, 3\)"),
                                      ({"ctx": torch.tensor(1.0)}, r"'ctx' is \(\)"),
                                      ({"ctx": [0.0] * 4}, r"'ctx' is list")])
def test_drafter_tensors_without_a_row_per_slot_are_refused_by_name(bad, why):
    with pytest.raises(ValueError, match=why + r"; it needs a first dimension of >= 4 \(one row per request slot\)"):
        StepState.allocate(4, 5, 2, device="cpu", hidden_dtype=torch.float32, drafter=bad)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    target = tmp_path_factory.mktemp("llama")
    make_checkpoint("llama", target, num_hidden_layers=4, seed=3)
    head = tmp_path_factory.mktemp("head")
    saved_tiny_head(head, seed=1, capture_layers=(1, 2, 3), std=0.1)
    import specdec

    config = SpecConfig(drafter="eagle3", max_draft_len=3, max_batch_size=2, max_seq_len=64, kv_block_size=4)
    return SpecDecoder.from_pretrained(specdec.load_target(target), head, config)


def test_the_engines_state_holds_the_head_drafters_own_slot_tensors(decoder):
    drafter, state = decoder.engine.strategies.drafter, decoder.engine.state
    assert sorted(state.drafter) == ["ctx_hidden", "live", "root_logits"]
    for name, x in drafter.slot_state().items():
        assert state.drafter[name] is x  # one storage: the prefill's writes are what the step reads


def test_a_state_without_the_drafters_tensors_is_a_clear_error(decoder):
    drafter = decoder.engine.strategies.drafter
    N = drafter.num_tree_slots
    bare = StepState.for_drafting(root_tokens=torch.zeros(2, dtype=torch.int64), committed_len=torch.zeros(2, dtype=torch.int64),
                                  accept_length=torch.full((2,), -1), accept_tokens=torch.full((2, N), -1),
                                  active=torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"carries no slot tensors of this EAGLE-3 head \(it has \[\]\): build it with "
                                         r"StepState.allocate\(\.\.\., drafter=drafter.slot_state\(\)\)"):
        drafter.propose(bare)
