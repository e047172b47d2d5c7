"""A third-party specdec plugin: verifier="top2", accept a draft token if it is among the
target's two most likely tokens there. Lossy (marked so); the bonus token is the argmax.

Installed with `pip install examples/third_party_plugin`, found through the entry-point group
`specdec`, selected with `SpecConfig(verifier="top2")`. It uses only public specdec objects.
"""

import torch

from specdec import Acceptance, hookimpl


class Top2Verifier:
    lossless = False  # relaxed acceptance: output may differ from the target's greedy output
    needs_draft_probs = False

    def __call__(self, tokens, tree, target_logits, sampling, *, draft_probs=None, generator=None, uniforms=None):
        B, N = tokens.shape
        top2 = target_logits.topk(2, dim=-1).indices  # [B, N, 2]
        rows = torch.arange(B, device=tokens.device)
        nodes = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)
        out = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)
        nodes[:, 0] = 0
        cur = torch.zeros(B, dtype=torch.int64, device=tokens.device)
        length = torch.zeros(B, dtype=torch.int64, device=tokens.device)
        going = torch.ones(B, dtype=torch.bool, device=tokens.device)
        for _ in range(N - 1):  # one depth per iteration
            child, found = tree.next_token[rows, cur], torch.full_like(cur, -1)
            for _ in range(N - 1):  # walk siblings; the first one in the top-2 wins
                ok = (child >= 0) & (found < 0) & (top2[rows, cur] == tokens[rows, child.clamp(min=0)][:, None]).any(-1)
                found = torch.where(ok, child, found)
                child = torch.where(child >= 0, tree.next_sibling[rows, child.clamp(min=0)], child)
            going = going & (found >= 0)
            out[rows, length] = torch.where(going, tokens[rows, found.clamp(min=0)], out[rows, length])
            length = length + going.long()
            nodes[rows, length] = torch.where(going, found, nodes[rows, length])
            cur = torch.where(going, found, cur)
        out[rows, length] = target_logits[rows, cur].argmax(-1)  # bonus token
        return Acceptance(accept_length=length, accept_nodes=nodes, accept_tokens=out)


@hookimpl
def specdec_strategy_names():
    return {"verifier": ["top2"]}


@hookimpl
def specdec_verify(config):
    return Top2Verifier() if config.verifier == "top2" else None
