"""Test helper: an ``attend(q, k, v)`` that keeps every key it was given and attends causally
over all of them (plain SDPA, no paging, no tree masks): the dense reference of a draft head's
attention over a growing context. Not a test module (leading underscore)."""

import torch


def growing_sdpa(scale: float):
    """Each call appends its K/V ([B, T, Hkv, hd]) and attends with its T queries, the last T of
    the keys so far, causally over every key (earlier calls' keys all visible)."""
    ks, vs = [], []

    def attend(q, k, v):
        ks.append(k)
        vs.append(v)
        K, Vv = torch.cat(ks, 1), torch.cat(vs, 1)
        T, S = q.shape[1], K.shape[1]
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), K.transpose(1, 2), Vv.transpose(1, 2), attn_mask=mask, scale=scale, enable_gqa=True
        )
        return o.transpose(1, 2)

    return attend
