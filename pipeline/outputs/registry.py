"""The outputs' registry: every module of this package that declares a PLUGIN is an output type.

Adding an output type is one new file here: its settings model (a subclass of `OutputSettings` with a `type`
literal), its `Sink`, and `PLUGIN = Plugin("name", Settings, SinkClass)`. The configuration composes the settings
models found here into the `outputs:` list, and the daemon creates sinks through `create_sink`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pipeline.core.registry import Registry
from pipeline.outputs.base import OutputSettings, Sink


@lru_cache(maxsize=1)
def outputs() -> Registry[type[Sink]]:
    return Registry.discover("output type", "pipeline.outputs")


def output_settings_models() -> tuple[type[OutputSettings], ...]:
    """Every output's settings model, for the `outputs:` union of the configuration."""
    models = []
    for plugin in outputs().all():
        if plugin.settings is None or not issubclass(plugin.settings, OutputSettings):
            raise TypeError(f"output {plugin.name}: its settings must subclass OutputSettings")
        models.append(plugin.settings)
    return tuple(models)


def create_sink(cfg: OutputSettings, **context: Any) -> Sink:
    """The sink for one `outputs:` entry; `context` carries daemon-wide facts some outputs use (rule presets)."""
    sink_class = outputs().get(cfg.type).implementation
    return sink_class.from_settings(cfg, **context)
