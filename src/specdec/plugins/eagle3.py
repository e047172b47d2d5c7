"""drafter="eagle3": EAGLE-3 drafting; the tree policy (`config.tree`: "linear", "dynamic",
"static", "sampled" or a third party's) decides the shape, the head only expands frontiers.

Options, in ``SpecConfig.plugin_options["eagle3"]`` (a dict):

- ``"checkpoint"``: path of an EAGLE-3 head (official SafeAILab/SpecForge layout or vLLM
  speculators; see `specdec.drafters.eagle3_checkpoint`), loaded strictly and checked
  against the target; or an already built `Eagle3Model` (also accepted as ``"model"``).
- ``"device"`` / ``"dtype"``: where to run the head (default: those of the target model,
  else cpu / float32).
- ``"seed"``: mixed into the keys of the draft-sampling draws (default 0).

Drafts are sampled exactly when the tree policy samples (``policy.samples``: `sampled`, or
any built-in policy under a verifier that needs draft probabilities), and `draft_probs` are
returned exactly when the verifier needs them (``verifier.needs_draft_probs``), whatever its
name.

Capture layers (output convention): the checkpoint's own layers when its config names them
(converted from the speculators input convention), else ``(1, L//2 - 1, L - 4)``; an
explicit ``config.layers_to_capture`` must agree with the checkpoint's, and ids written in
the input convention are caught with a message naming the converter.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.config import ConfigError, SpecConfig
from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.plugins.options import device_and_dtype, plugin_options

NAME = "eagle3"
_KNOWN = frozenset({"checkpoint", "model", "device", "dtype", "seed"})


def _options(config: SpecConfig) -> dict:
    return plugin_options(config, NAME, _KNOWN)


def _source(options: dict):
    from specdec.drafters.eagle3_model import Eagle3Model

    src = options.get("model", options.get("checkpoint"))
    if src is None:
        raise ConfigError(
            "drafter='eagle3' needs a head: SpecDecoder.from_pretrained(target, draft=PATH, ...) or "
            "plugin_options={'eagle3': {'checkpoint': PATH}} (a folder with config.json + weights, or an Eagle3Model)"
        )
    if isinstance(src, Eagle3Model):
        return src
    if isinstance(src, (str, Path)):
        return Path(src).expanduser()
    raise ConfigError(f"plugin_options['eagle3']['checkpoint'] must be a path or an Eagle3Model, got {type(src).__name__}")


def _checkpoint_layers(src) -> tuple[int, ...] | None:
    from specdec.drafters.capture_conventions import checkpoint_capture_layers

    if isinstance(src, Path):
        cfg_file = src / "config.json"
        if not cfg_file.exists():
            raise ConfigError(f"draft checkpoint {src} has no config.json")
        return checkpoint_capture_layers(json.loads(cfg_file.read_text()), source=str(cfg_file))
    return src.config.capture_layers


@strategy_hook(NAME)
def specdec_capture_layers(config: SpecConfig, target):
    from specdec.drafters.capture_conventions import check_capture_layers

    return check_capture_layers(config.layers_to_capture, _checkpoint_layers(_source(_options(config))), target.num_layers)


@strategy_hook(NAME)
def specdec_draft(config: SpecConfig, target, policy, verifier):
    from specdec.drafters.eagle3_checkpoint import check_against_target, load_eagle3
    from specdec.drafters.eagle3_drafter import Eagle3Drafter

    options = _options(config)
    src = _source(options)
    device, dtype = device_and_dtype(options, target, NAME)
    if isinstance(src, Path):
        model = load_eagle3(src, device=device, dtype=dtype)
    else:
        model = src.to(device=device, dtype=dtype)
    layers = check_against_target(model.config, target, source=str(src) if isinstance(src, Path) else "Eagle3Model")
    if config.layers_to_capture is not None:
        from specdec.drafters.capture_conventions import check_capture_layers

        check_capture_layers(config.layers_to_capture, model.config.capture_layers, target.num_layers)
    if len(config.layers_to_capture or layers) != model.config.num_capture:
        raise ConfigError(
            f"capture layers {config.layers_to_capture or layers} give {len(config.layers_to_capture or layers)} "
            f"states but the head's fc reads num_capture={model.config.num_capture}"
        )
    target_model = target.model
    embed = None
    if model.embed_tokens is None:
        if target_model is None or not hasattr(target_model, "embed"):
            raise ConfigError(
                "the EAGLE-3 head shares the target's embeddings: resolve with a TargetInfo that carries the "
                "loaded target (TargetInfo.model)"
            )
        lookup = getattr(target_model, "embed_lookup", None)  # a plain table: looked up in the draft glue
        embed = target_model.embed if lookup is None else lookup
    return Eagle3Drafter(
        model, config, embed=embed, samples_drafts=verifier.needs_draft_probs, seed=int(options.get("seed", 0)),
        policy=policy,
    )


specdec_strategy_names = declared_names(specdec_capture_layers, specdec_draft)
