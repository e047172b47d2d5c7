"""EAGLE-3 heads of several draft layers: the later layers are plain Llama decoder layers
(against transformers' own), a deepened head starts as the head it came from, and each layer
attends over its own keys."""

import pytest
import torch

from specdec.drafters.draft_attention import causal_attend
from specdec.train.trainer import deepen

from _eagle3_heads import D_T, V, random_head

WIDTH = 3 * D_T


def _inputs(T=9, B=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    embeds = torch.randn(B, T, D_T, generator=g, dtype=torch.float64)
    hidden = torch.randn(B, T, WIDTH, generator=g, dtype=torch.float64)
    positions = torch.arange(T)[None].expand(B, T)
    return embeds, hidden, positions


def test_a_later_layer_is_transformers_llama_decoder_layer_over_the_first_layers_output():
    """Two layers: logits = transformers' one-layer Llama (the later layer, the head's norm and
    lm_head) fed the first layer's output; the first layer is the one-layer head's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    two = random_head(seed=3, dtype=torch.float64, num_layers=2)
    one = random_head(seed=0, dtype=torch.float64)
    one.load_state_dict({k: v for k, v in two.state_dict().items() if not k.startswith("later_layers.")})
    c = two.config
    embeds, hidden, positions = _inputs()
    attend = causal_attend(c.head_dim**-0.5)
    with torch.no_grad():
        out, logits = two(embeds, hidden, positions, [attend, attend], first_step=True)
        first, _ = one(embeds, hidden, positions, attend, first_step=True)
    hf_cfg = AutoConfig.for_model(
        "llama", vocab_size=c.draft_vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=1, num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope.theta, tie_word_embeddings=False,
    )
    hf = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").double().eval()
    state = {f"model.layers.0.{k[len('later_layers.0.'):]}": v for k, v in two.state_dict().items()
             if k.startswith("later_layers.0.")}
    state["model.norm.weight"] = two.norm.weight
    state["lm_head.weight"] = two.lm_head.weight
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert missing == ["model.embed_tokens.weight"] and not unexpected
    with torch.no_grad():
        ref = hf(inputs_embeds=first, position_ids=positions).logits
    # not bit for bit: both sides' RMSNorms compute in float32 (HF-exact), here on float64 inputs
    torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, first)  # the second layer did something


def test_a_deepened_head_drafts_what_the_head_it_came_from_drafts():
    head = random_head(seed=4, dtype=torch.float64)
    deeper = deepen(head, 3, torch.Generator().manual_seed(0), std=0.3).double()
    assert deeper.config.num_layers == 3 and len(deeper.later_layers) == 2
    embeds, hidden, positions = _inputs(seed=1)
    attend = causal_attend(head.config.head_dim**-0.5)
    with torch.no_grad():
        out, logits = head(embeds, hidden, positions, attend, first_step=True)
        out3, logits3 = deeper(embeds, hidden, positions, [attend] * 3, first_step=True)
    assert torch.equal(out3, out) and torch.equal(logits3, logits)
    # trainable: the new layers' q/k/v and gate/up are random, not zero (o_proj / down_proj are)
    layer = deeper.later_layers[1].requires_grad_(False)
    assert float(layer.self_attn.qkv_proj.weight.abs().sum()) > 0 and float(layer.mlp.gate_up_proj.weight.abs().sum()) > 0
    assert float(layer.self_attn.o_proj.weight.abs().sum()) == 0 and float(layer.mlp.down_proj.weight.abs().sum()) == 0
    assert deepen(head, 1, torch.Generator(), std=0.3) is head


def test_a_head_of_several_layers_wants_one_attend_per_layer():
    head = random_head(num_layers=2)
    embeds, hidden, positions = _inputs(T=3, B=1)
    attend = causal_attend(head.config.head_dim**-0.5)
    with pytest.raises(TypeError, match=r"num_layers=2: pass one attend callback per layer"):
        head(embeds.float(), hidden.float(), positions, attend, first_step=True)
    with pytest.raises(TypeError, match=r"num_layers=2: pass 2 attend callbacks, got 3"):
        head(embeds.float(), hidden.float(), positions, [attend] * 3, first_step=True)
    with pytest.raises(ValueError, match=r"Eagle3Config.num_layers=0 must be an int >= 1"):
        random_head(num_layers=0)
    assert V > 0
