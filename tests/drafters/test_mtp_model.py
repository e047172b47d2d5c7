"""The MTP head's math: against transformers' own decoder layer, the trainer's forward, config checks."""

import pytest
import torch

from specdec.drafters.mtp_model import MTPConfig, MTPModel, MTPShapeError, causal_attend

from _attend import growing_sdpa
from _mtp_heads import D, V, mtp_config, random_mtp


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def hf_reference(model: MTPModel, head: torch.nn.Linear, embeds, hidden):
    """logits of `model` computed with a 1-layer transformers Qwen2/Llama (its layer, RoPE and
    final norm stand in for the MTP block and final_layernorm), from inputs_embeds = the fused pair."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = model.config
    family = "qwen2" if cfg.qkv_bias else "llama"
    hf_cfg = AutoConfig.for_model(
        family, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=1, num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope.theta, tie_word_embeddings=False,
    )
    hf = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").double().eval()
    state = {f"model.layers.0.{k}": v for k, v in model.state_dict().items()
             if k.split(".")[0] in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")}
    state["model.norm.weight"] = model.final_layernorm.weight
    state["lm_head.weight"] = model.lm_head.weight if model.lm_head is not None else head.weight
    missing, _ = hf.load_state_dict(state, strict=False)
    assert missing == ["model.embed_tokens.weight"]
    e = _rms(embeds, model.token_layernorm.weight, cfg.rms_norm_eps)
    h = _rms(hidden, model.hidden_layernorm.weight, cfg.rms_norm_eps)
    pair = [e, h] if cfg.concat_order == "embed_first" else [h, e]
    x = torch.cat(pair, -1) @ model.input_proj.weight.T
    with torch.no_grad():
        return hf(inputs_embeds=x).logits


@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # DeepSeek-V3 style: [enorm(e); hnorm(h)], shared head
        dict(concat_order="hidden_first", qkv_bias=True, feed_normed=True),  # MiMo: Qwen2 block
        dict(has_lm_head=True),
    ],
    ids=["deepseek", "mimo", "own-head"],
)
def test_sequence_forward_equals_transformers_decoder_layer_on_the_fused_input(kw):
    model = random_mtp(seed=1, dtype=torch.float64, **kw)
    if model.config.qkv_bias:
        with torch.no_grad():
            model.self_attn.qkv_proj.bias.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
    head = torch.nn.Linear(D, V, bias=False).double()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 11, D, generator=g, dtype=torch.float64)
    embeds = torch.randn(2, 11, D, generator=g, dtype=torch.float64)
    with torch.no_grad():
        _, logits = model.sequence_forward(hidden, embeds, head=head)
    ref = hf_reference(model, head, embeds, hidden)
    assert torch.allclose(logits, ref, atol=1e-5)  # both sides normalize in float32 (HF-exact RMSNorm)


def test_feedback_is_the_block_output_or_its_final_norm_as_configured():
    hidden = torch.randn(1, 5, D, dtype=torch.float64)
    embeds = torch.randn(1, 5, D, dtype=torch.float64)
    raw = random_mtp(seed=3, dtype=torch.float64, has_lm_head=True)
    normed = random_mtp(seed=3, dtype=torch.float64, has_lm_head=True, feed_normed=True)
    with torch.no_grad():
        f_raw, l_raw = raw.sequence_forward(hidden, embeds)
        f_normed, l_normed = normed.sequence_forward(hidden, embeds)
    assert torch.equal(l_raw, l_normed)
    assert torch.allclose(f_normed, raw.final_layernorm(f_raw), atol=1e-12)
    assert not torch.allclose(f_raw, f_normed)


def test_the_decode_path_in_chunks_equals_the_full_sequence_forward():
    model = random_mtp(seed=4, dtype=torch.float64, has_lm_head=True)
    hidden = torch.randn(1, 9, D, dtype=torch.float64)
    embeds = torch.randn(1, 9, D, dtype=torch.float64)
    attend = growing_sdpa(16**-0.5)  # each chunk sees the earlier chunks and itself causally
    with torch.no_grad():
        full_f, full_l = model.sequence_forward(hidden, embeds)
        parts = [(0, 4), (4, 5), (5, 9)]
        outs = [model(embeds[:, a:b], hidden[:, a:b], torch.arange(a, b)[None], attend) for a, b in parts]
    assert torch.allclose(torch.cat([o[1] for o in outs], 1), full_l, atol=1e-10)
    assert torch.allclose(torch.cat([o[0] for o in outs], 1), full_f, atol=1e-10)


def test_a_trainer_can_backpropagate_through_the_sequence_forward_with_a_frozen_shared_head():
    model = random_mtp(seed=5).train()
    head = torch.nn.Linear(D, V, bias=False).requires_grad_(False)
    hidden = torch.randn(2, 7, D)
    embeds = torch.randn(2, 7, D)
    targets = torch.randint(0, V, (2, 7))
    feedback, logits = model.sequence_forward(hidden, embeds, head=head)
    _, logits2 = model.sequence_forward(feedback, embeds.roll(-1, 1), head=head)  # a second (recursive) step
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss = loss + torch.nn.functional.cross_entropy(logits2.reshape(-1, V), targets.roll(-1, 1).reshape(-1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, name
    assert head.weight.grad is None


def test_bad_configs_and_inputs_are_clear_errors():
    with pytest.raises(ValueError, match=r"concat_order='sideways' is unknown; allowed: \['embed_first', 'hidden_first'\]"):
        mtp_config(concat_order="sideways")
    with pytest.raises(ValueError, match=r"num_attention_heads=4 must be a multiple of num_key_value_heads=3"):
        mtp_config(num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"MTPConfig.hidden_size=0 must be an int >= 1"):
        mtp_config(hidden_size=0)
    model = random_mtp()
    with pytest.raises(MTPShapeError, match=r"reads hidden states of width d=64 .* got 32"):
        model.sequence_forward(torch.zeros(1, 3, 32), torch.zeros(1, 3, D), head=torch.nn.Linear(D, V))
    with pytest.raises(ValueError, match=r"no lm_head of its own; pass the target's head"):
        model.sequence_forward(torch.zeros(1, 3, D), torch.zeros(1, 3, D))
    assert isinstance(MTPConfig(**mtp_config().__dict__), MTPConfig)
    assert callable(causal_attend(0.25))


def test_logits_rows_gives_the_full_forwards_logits_at_those_rows_alone():
    """A prompt chunk's MTP head runs on its last row only (`logits_rows`), [B, 1, V]."""
    model = random_mtp(seed=5, dtype=torch.float64, has_lm_head=True)
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(2, 6, D, generator=gen, dtype=torch.float64)
    embeds = torch.randn(2, 6, D, generator=gen, dtype=torch.float64)
    pos = torch.arange(6)[None].expand(2, -1)
    attend = lambda q, k, v: q  # noqa: E731
    with torch.no_grad():
        feed, logits = model(embeds, hidden, pos, attend)
        rows = torch.tensor([5, 2])
        feed_r, logits_r = model(embeds, hidden, pos, attend, logits_rows=rows)
    assert logits_r.shape == (2, 1, V)
    torch.testing.assert_close(logits_r[:, 0], logits[torch.arange(2), rows], rtol=1e-12, atol=1e-12)
    assert torch.equal(feed_r, feed)
