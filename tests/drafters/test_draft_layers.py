"""The draft heads' fused projections keep Hugging Face checkpoint names: state_dict() splits
qkv_proj / gate_up_proj into q/k/v and gate/up, load_state_dict() joins them, and the fused
forward equals separate projections on the same weights."""

import pytest
import torch
import torch.nn.functional as F

from specdec.drafters.draft_layers import DraftAttention, SwiGLU

IN, D, H, HKV, HD, FFN = 12, 8, 4, 2, 4, 10


def _attention(bias: bool) -> DraftAttention:
    return DraftAttention(IN, D, H, HKV, HD, qkv_bias=bias, o_bias=bias).double()


def _random_state(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in module.state_dict().items()}


@pytest.mark.parametrize("bias", [False, True])
def test_attention_state_dict_has_the_hugging_face_names_and_round_trips(bias):
    attn = _attention(bias)
    state = attn.state_dict()
    names = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}
    if bias:
        names |= {"q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"}
    assert set(state) == names
    assert state["q_proj.weight"].shape == (H * HD, IN) and state["k_proj.weight"].shape == (HKV * HD, IN)
    loaded = _random_state(attn, 1)
    attn.load_state_dict(loaded, strict=True)
    assert all(torch.equal(attn.state_dict()[k], loaded[k]) for k in loaded)
    # the fused rows are [q; k; v] in that order
    assert torch.equal(attn.qkv_proj.weight[H * HD : (H + HKV) * HD], loaded["k_proj.weight"])


def test_fused_attention_forward_equals_separate_projections():
    attn = _attention(True)
    w = _random_state(attn, 2)
    attn.load_state_dict(w)
    x = torch.randn(2, 3, IN, dtype=torch.float64)
    cos, sin = torch.ones(2, 3, 1, HD, dtype=torch.float64), torch.zeros(2, 3, 1, HD, dtype=torch.float64)  # RoPE at 0
    seen = {}

    def attend(q, k, v):
        seen.update(q=q, k=k, v=v)
        return q

    out = attn(x, cos, sin, attend)
    q = F.linear(x, w["q_proj.weight"], w["q_proj.bias"]).view(2, 3, H, HD)
    assert torch.allclose(seen["q"], q)
    assert torch.allclose(seen["k"], F.linear(x, w["k_proj.weight"], w["k_proj.bias"]).view(2, 3, HKV, HD))
    assert torch.allclose(seen["v"], F.linear(x, w["v_proj.weight"], w["v_proj.bias"]).view(2, 3, HKV, HD))
    assert torch.allclose(out, F.linear(q.reshape(2, 3, H * HD), w["o_proj.weight"], w["o_proj.bias"]))


def test_swiglu_names_and_forward():
    mlp = SwiGLU(D, FFN).double()
    assert set(mlp.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    w = _random_state(mlp, 3)
    mlp.load_state_dict(w, strict=True)
    x = torch.randn(5, D, dtype=torch.float64)
    ref = F.linear(F.silu(F.linear(x, w["gate_proj.weight"])) * F.linear(x, w["up_proj.weight"]), w["down_proj.weight"])
    assert torch.allclose(mlp(x), ref)


def test_a_checkpoint_missing_a_part_is_refused_by_strict_loading():
    attn = _attention(False)
    state = _random_state(attn, 4)
    del state["v_proj.weight"]
    with pytest.raises(RuntimeError, match="qkv_proj.weight"):
        attn.load_state_dict(state, strict=True)
