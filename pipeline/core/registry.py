"""One registry helper for every plugin role (outputs, inference backends): the YAML's `type` picks a plugin.

A plugin is a module that declares `PLUGIN = Plugin(name, settings, implementation)`: the name used in the YAML, the
pydantic model of its settings (declared next to its code), and the class that does the work. A registry knows its
plugins' modules by name and imports a module only when asked, so an optional runtime (TensorRT, onnxruntime-gpu) is
imported only when it is configured. `discover` builds a registry from every plugin module of a package, so adding a
plugin of that role is one new file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class PluginError(LookupError):
    """No plugin of that name, or a module that does not declare one; the message lists what is available."""


@dataclass(frozen=True)
class Plugin(Generic[T]):
    """What a plugin module declares as its `PLUGIN`."""

    name: str  # the value in the YAML (`outputs[].type`, `inference.backend`)
    settings: type[BaseModel] | None  # its settings model, or None when it has none of its own
    implementation: T  # the class that does the work


class Registry(Generic[T]):
    """Plugins of one role by name; each module is imported on first use."""

    def __init__(self, role: str, modules: Mapping[str, str]) -> None:
        """`modules`: plugin name -> module path, e.g. {"tensorrt": "pipeline.inference.gpu.tensorrt"}."""
        self.role = role
        self._modules = dict(modules)

    @classmethod
    def discover(cls, role: str, package: str) -> Registry[T]:
        """Every module of `package` that declares a PLUGIN (imports them all, at once)."""
        root = importlib.import_module(package)
        modules: dict[str, str] = {}
        for info in pkgutil.iter_modules(root.__path__, prefix=f"{package}."):
            plugin = getattr(importlib.import_module(info.name), "PLUGIN", None)
            if isinstance(plugin, Plugin):
                if plugin.name in modules:
                    raise PluginError(f"{role} {plugin.name!r} is declared by {modules[plugin.name]} and {info.name}")
                modules[plugin.name] = info.name
        return cls(role, modules)

    def names(self) -> list[str]:
        return sorted(self._modules)

    def get(self, name: str) -> Plugin[T]:
        """The plugin called `name`; PluginError listing the available names when there is none."""
        module_name = self._modules.get(name)
        if module_name is None:
            raise PluginError(f"unknown {self.role} {name!r} (available: {', '.join(self.names())})")
        plugin = getattr(importlib.import_module(module_name), "PLUGIN", None)
        if not isinstance(plugin, Plugin) or plugin.name != name:
            raise PluginError(f"{module_name} does not declare the {self.role} plugin {name!r}")
        return plugin

    def all(self) -> list[Plugin[T]]:
        """Every plugin, in name order (imports every module)."""
        return [self.get(name) for name in self.names()]
