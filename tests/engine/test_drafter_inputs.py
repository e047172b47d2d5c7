"""What the drafter is fed after every step equals a dense recomputation along the accepted path.

After a step that accepted `a` drafts, the drafter's next `propose` reads, for each slot,
the target's states at the path's positions committed - (a + 1) ... committed - 1: the
captured layer outputs (EAGLE-3) or the final normed state (MTP). Outputs stay exact if the
step gathers the wrong rows (the tree's first rows instead of the accepted path's), so only
a direct check catches it: here every fed row is compared with transformers' own forward
over the whole sequence so far (`output_hidden_states`; hidden_states[i + 1] is layer i's
output, the last entry the normed state), fp32, atol 1e-4. Greedy and sampled requests,
chains and dynamic trees, several requests per step.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.drafters.mtp_checkpoint import save_mtp

from _mtp_heads import bigram_oracle_mtp, e2e_cpu  # noqa: F401  (e2e_cpu: a fixture)

pytestmark = [pytest.mark.usefixtures("e2e_cpu"),
              pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning")]
CAPTURE = (1, 3, 4)
PROMPTS = [[5, 17, 33, 8, 2], [9, 9, 40, 9, 9, 40, 9], [71, 3]]
SETUPS = {  # name -> (target, head, config)
    "eagle3-chain": ("llama", "eagle3", dict(drafter="eagle3", max_draft_len=3)),
    "eagle3-tree": ("llama", "eagle3", dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3, max_total_draft_tokens=7)),
    "mtp-oracle-chain": ("bigram", "mtp", dict(drafter="mtp", max_draft_len=4)),
    "mtp-oracle-tree": ("bigram", "mtp", dict(drafter="mtp", tree="dynamic", topk=2, max_draft_len=3)),
}


@pytest.fixture(scope="module")
def saved_setups(tiny_llama8, bigram_llama, tiny_eagle3_head, tmp_path_factory):
    """The saved targets and heads by SETUPS name (the bigram target: drafts are accepted, long
    paths; the EAGLE-3 head captures CAPTURE), and transformers' models of the two targets."""
    from transformers import AutoModelForCausalLM

    assert CAPTURE == (1, 3, 4)  # the capture layers of `tiny_eagle3_head`
    mtp = tmp_path_factory.mktemp("fed_mtp")
    save_mtp(bigram_oracle_mtp(), mtp)
    paths = dict(llama=tiny_llama8, bigram=bigram_llama, eagle3=tiny_eagle3_head, mtp=mtp)
    hf = {name: AutoModelForCausalLM.from_pretrained(str(paths[name]), dtype=torch.float32, attn_implementation="eager").eval()
          for name in ("llama", "bigram")}
    return dict(paths=paths, hf=hf)


def _record(dec: SpecDecoder) -> list:
    """Every propose after a step: (the slot's token sequence so far, committed, a, fed rows [a + 1, w])."""
    drafter, engine, fed = dec.strategies.drafter, dec.engine, []
    inner = drafter.propose

    def propose(state, **kw):
        lengths, committed = state.accept_length.tolist(), state.committed_len.tolist()
        for slot, live in enumerate(state.active.tolist()):
            request = engine.slots[slot]
            if live and lengths[slot] >= 0 and request is not None:
                a = lengths[slot]
                fed.append((request.prompt + request.token_ids, committed[slot], a, state.hidden_path[slot, : a + 1].clone()))
        return inner(state, **kw)

    drafter.propose = propose
    return fed


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", list(SETUPS))
def test_the_drafter_is_fed_the_target_states_along_the_accepted_path(saved_setups, name, sampled):
    target_name, head, cfg = SETUPS[name]
    config = SpecConfig(**cfg, verifier="target-only", max_batch_size=3, max_seq_len=96, kv_block_size=4)
    paths = saved_setups["paths"]
    dec = SpecDecoder.from_pretrained(specdec.load_target(paths[target_name]), paths[head], config)
    fed = _record(dec)
    params = [SamplingParams(max_new_tokens=20, ignore_eos=True, **(dict(temperature=1.0, seed=i) if sampled else {}))
              for i in range(len(PROMPTS))]
    dec.generate(PROMPTS, params)
    hf = saved_setups["hf"][target_name]
    assert len(fed) >= 6
    longest = 0
    for seq, committed, a, rows in fed:
        positions = list(range(committed - (a + 1), committed))
        with torch.no_grad():
            states = hf(torch.tensor([seq[:committed]]), output_hidden_states=True).hidden_states
        if head == "eagle3":  # the captured layer outputs, concatenated
            want = torch.cat([states[layer + 1][0, positions] for layer in CAPTURE], -1)
        else:  # MTP reads the final normed state
            want = states[-1][0, positions]
        torch.testing.assert_close(rows, want, atol=1e-4, rtol=1e-4,
                                   msg=lambda m: f"positions {positions} (accepted {a}): {m}")
        longest = max(longest, a)
    if head == "mtp":
        assert longest >= 2  # the oracle's drafts are accepted: whole paths are checked

