"""drafter="mtp": MTP-style drafting from the target's last hidden state (MTP-Eagle mode: one
MTP module applied recursively, once per depth), its trees grown by the tree policy
(`config.tree`).

Written as a third party would: only the public hooks. It answers `specdec_capture_layers`
with ``()`` (no capture buffer) and its drafter says ``reads = "last_hidden"``, so the
runner hands it the target's final-normed hidden state. Drafts are sampled exactly when the
tree policy samples, and `draft_probs` returned exactly when the verifier needs them.

Options, in ``SpecConfig.plugin_options["mtp"]`` (a dict):

- ``"checkpoint"``: a folder in the specdec standalone layout or the MiMo layout (see
  `specdec.drafters.mtp_checkpoint`), loaded strictly and checked against the target; or
  an already built `MTPModel` (also accepted as ``"model"``).
  `SpecDecoder.from_pretrained(target, draft=..., config)` puts ``draft`` here.
- ``"layout"``: "auto" (default), "specdec" or "mimo".
- ``"mtp_layer"``: which ``model.mtp_layers.{i}`` of a MiMo checkpoint (default 0).
- ``"device"`` / ``"dtype"``: where to run the head (default: those of the target model).
- ``"seed"``: mixed into the keys of the draft-sampling draws (default 0).
- ``"draft_vocab"``: restrict drafting to a draft vocabulary: ``"auto"`` (default: the
  checkpoint folder's ``draft_vocab.safetensors`` when it has one, else the full vocabulary),
  ``"full"``, a path to such a file, or a [Vd] int64 tensor of ascending target ids. Only
  for heads that share the target's lm_head (specdec's; not a MiMo head with its own).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.config import ConfigError, SpecConfig
from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.plugins.options import device_and_dtype, plugin_options

NAME = "mtp"
_KNOWN = frozenset(
    {"checkpoint", "model", "layout", "mtp_layer", "device", "dtype", "seed", "draft_vocab"}
)


def _options(config: SpecConfig) -> dict:
    return plugin_options(config, NAME, _KNOWN)


def _load(options: dict, device, dtype):
    from specdec.drafters.mtp_checkpoint import load_mtp
    from specdec.drafters.mtp_model import MTPModel

    src = options.get("model", options.get("checkpoint"))
    if src is None:
        raise ConfigError(
            "drafter='mtp' needs a head: SpecDecoder.from_pretrained(target, draft=PATH, ...) or "
            "plugin_options={'mtp': {'checkpoint': PATH}} (a specdec or MiMo-layout folder, or an MTPModel)"
        )
    if isinstance(src, MTPModel):
        return src.to(device=device, dtype=dtype), "MTPModel"
    if isinstance(src, (str, Path)):
        path = Path(src).expanduser()
        model = load_mtp(
            path, layout=options.get("layout", "auto"), layer=options.get("mtp_layer", 0), device=device, dtype=dtype
        )
        return model, str(path)
    raise ConfigError(f"plugin_options['mtp']['checkpoint'] must be a path or an MTPModel, got {type(src).__name__}")


def _draft_vocab(options: dict, vocab_size: int):
    """[Vd] int64 target ids of the draft vocabulary, or None for the full vocabulary."""
    from specdec.drafters.mtp_checkpoint import check_draft_vocab, load_draft_vocab

    choice = options.get("draft_vocab", "auto")
    if isinstance(choice, torch.Tensor):
        return check_draft_vocab(choice.to("cpu", torch.int64), vocab_size, "plugin_options['mtp']['draft_vocab']")
    if choice == "full":
        return None
    if choice == "auto":
        src = options.get("model", options.get("checkpoint"))
        return load_draft_vocab(src, vocab_size=vocab_size) if isinstance(src, (str, Path)) else None
    if isinstance(choice, (str, Path)):
        return load_draft_vocab(choice, vocab_size=vocab_size)
    raise ConfigError(
        f"plugin_options['mtp']['draft_vocab']={choice!r}; allowed: 'auto', 'full', a path, or an int64 tensor of target ids"
    )


@strategy_hook(NAME)
def specdec_capture_layers(config: SpecConfig, target):
    if config.layers_to_capture is not None:
        raise ConfigError(
            f"drafter='mtp' reads the target's last hidden state only; layers_to_capture={config.layers_to_capture} "
            "must be None"
        )
    return ()


@strategy_hook(NAME)
def specdec_draft(config: SpecConfig, target, policy, verifier):
    from specdec.drafters.mtp_checkpoint import check_against_target
    from specdec.drafters.mtp_drafter import MTPDrafter, restricted_head

    options = _options(config)
    device, dtype = device_and_dtype(options, target, NAME)
    model, source = _load(options, device, dtype)
    check_against_target(model.config, target, source=source)
    target_model = target.model
    if target_model is None or not hasattr(target_model, "embed"):
        raise ConfigError(
            "the MTP head shares the target's embeddings: resolve with a TargetInfo that carries the loaded target "
            "(TargetInfo.model), as SpecDecoder does"
        )
    head, weight = None, None
    if model.lm_head is None:
        lm_head = getattr(target_model, "lm_head", None)
        if lm_head is None:
            raise ConfigError(f"{source}: the MTP head has no lm_head and the target model exposes none to share")
        tp_size = getattr(getattr(target_model, "tp", None), "size", 1)
        if tp_size > 1:  # the target's head is vocabulary-sharded: its rows are this rank's slice only
            raise ConfigError(
                f"{source}: an MTP head without its own lm_head shares the target's, which is vocabulary-sharded at "
                f"tp_size={tp_size}; use tp_size=1 or an MTP head with its own lm_head"
            )
        weight = lm_head.weight
        if tuple(weight.shape) != (model.config.vocab_size, model.config.hidden_size):
            raise ConfigError(
                f"{source}: the target's lm_head is {tuple(weight.shape)}; the MTP head needs "
                f"[{model.config.vocab_size}, {model.config.hidden_size}]"
            )

        def shared_head(x: torch.Tensor) -> torch.Tensor:  # the target's head, in the target's dtype
            return lm_head(x.to(weight.dtype))

        head = shared_head
    target_ids = _draft_vocab(options, model.config.vocab_size)
    if target_ids is not None and weight is not None:  # (a module with its own lm_head is refused by MTPDrafter)
        head = restricted_head(weight, target_ids)
    lookup = getattr(target_model, "embed_lookup", None)  # a plain table: looked up in the draft glue
    return MTPDrafter(
        model, config, embed=target_model.embed if lookup is None else lookup, head=head, target_ids=target_ids,
        samples_drafts=verifier.needs_draft_probs, seed=int(options.get("seed", 0)), policy=policy,
    )


specdec_strategy_names = declared_names(specdec_capture_layers, specdec_draft)
