"""The plugin registry helper (pipeline.core.registry) and the two registries built on it (outputs, backends)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.registry import Plugin, PluginError, Registry
from pipeline.outputs.base import OutputSettings
from pipeline.outputs.registry import create_sink, output_settings_models, outputs

PLUGIN_MODULE = """
from typing import Literal
from pipeline.core.registry import Plugin
from pipeline.outputs.base import OutputSettings, Sink

class {cls}Settings(OutputSettings):
    type: Literal["{name}"] = "{name}"
    events: list[str] = ["command"]

class {cls}Sink(Sink):
    def write(self, event): pass

PLUGIN = Plugin("{name}", {cls}Settings, {cls}Sink)
"""


@pytest.fixture
def plugin_package(tmp_path: Path) -> Iterator[Path]:
    """An importable package `extra_outputs` in tmp_path; removed from sys.modules afterwards."""
    package = tmp_path / "extra_outputs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("VALUE = 1\n")  # a module without PLUGIN is not a plugin
    sys.path.insert(0, str(tmp_path))
    yield package
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m == "extra_outputs" or m.startswith("extra_outputs.")]:
        del sys.modules[name]


def test_a_new_plugin_is_one_new_file(plugin_package: Path) -> None:
    (plugin_package / "mqtt.py").write_text(textwrap.dedent(PLUGIN_MODULE.format(cls="Mqtt", name="mqtt")))
    registry: Registry[object] = Registry.discover("output type", "extra_outputs")
    assert registry.names() == ["mqtt"]
    plugin = registry.get("mqtt")
    assert plugin.name == "mqtt" and plugin.settings is not None and plugin.settings.__name__ == "MqttSettings"
    assert plugin.settings().describe() == "mqtt [command]"


def test_two_modules_claiming_one_name_are_refused(plugin_package: Path) -> None:
    for module in ("a", "b"):
        (plugin_package / f"{module}.py").write_text(textwrap.dedent(PLUGIN_MODULE.format(cls="Same", name="same")))
    with pytest.raises(PluginError, match="declared by extra_outputs.a and extra_outputs.b"):
        Registry.discover("output type", "extra_outputs")


def test_unknown_name_lists_what_is_available() -> None:
    registry: Registry[object] = Registry("thing", {"one": "pipeline.outputs.stdout"})
    with pytest.raises(PluginError, match=r"unknown thing 'two' \(available: one\)"):
        registry.get("two")
    with pytest.raises(PluginError, match="does not declare"):
        registry.get("one")  # the stdout module declares "stdout", not "one"


def test_every_output_module_is_registered_with_its_settings() -> None:
    assert outputs().names() == ["mqtt", "osc", "stdout", "webhook", "websocket"]
    models = output_settings_models()
    assert all(issubclass(model, OutputSettings) for model in models)
    assert {model.model_fields["type"].default for model in models} == set(outputs().names())


def test_create_sink_builds_the_registered_class_with_context() -> None:
    from pipeline.outputs.osc import OscOutput, OscSink

    sink = create_sink(OscOutput(port=9), presets=["wink"])
    assert isinstance(sink, OscSink)
    assert "wink" in sink.presets  # the rules' custom presets reach the VMC bundle


def test_plugin_is_a_plain_record() -> None:
    plugin = Plugin("x", None, int)
    assert (plugin.name, plugin.settings, plugin.implementation) == ("x", None, int)
