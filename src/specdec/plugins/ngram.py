"""drafter="ngram": model-free prompt-lookup drafting, its trees grown by the tree policy
(`config.tree`: "linear", "dynamic", "static" or a third party's greedy policy) over counted
continuations; see `specdec.drafters.ngram_drafter`.

Written as a third party would: only the public hooks. It reads no hidden state
(`specdec_capture_layers` answers ``()``; ``reads = "nothing"``), and it needs no
checkpoint. Its matching runs on the host, once per step (``runs_on_host = True``).

Options, in ``SpecConfig.plugin_options["ngram"]`` (a dict, validated into `NgramOptions`):
``min_match`` (default 1), ``max_match`` (default 3). ``"checkpoint"`` is refused: this
drafter has no model.
"""

from __future__ import annotations

from specdec.config import ConfigError, SpecConfig
from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.plugins.options import plugin_options

NAME = "ngram"


def _options(config: SpecConfig):
    from specdec.drafters.ngram_drafter import NgramOptions

    options = plugin_options(config, NAME)
    if "checkpoint" in options:
        raise ConfigError(
            f"drafter='ngram' has no model; got a draft checkpoint {options['checkpoint']!r} (leave draft=None)"
        )
    return NgramOptions.from_config(config, options)


@strategy_hook(NAME)
def specdec_capture_layers(config: SpecConfig, target):
    if config.layers_to_capture is not None:
        raise ConfigError(f"drafter='ngram' reads no hidden state; layers_to_capture={config.layers_to_capture} must be None")
    return ()


@strategy_hook(NAME)
def specdec_draft(config: SpecConfig, target, policy):
    from specdec.drafters.ngram_drafter import NgramDrafter

    model = target.model
    param = next(model.parameters(), None) if model is not None else None
    return NgramDrafter(config, _options(config), device=param.device if param is not None else "cpu", policy=policy)


specdec_strategy_names = declared_names(specdec_capture_layers, specdec_draft)
