"""The configuration's JSON Schema and its key reference, both generated from the pydantic models (issue 26 item 2).

Why generated: the models are what the loader enforces (every key, type, bound and description); a schema or a
reference written by hand would drift from them. `python run_pipeline.py schema` writes both; the committed copies
(config/schema.json, docs/config.md) are checked against a fresh generation by the tests, so they cannot go stale.
Editors that speak the YAML language server (VS Code's YAML extension, JetBrains, Neovim) read the schema from the
`# yaml-language-server: $schema=…` line at the top of config/default.yaml and the examples: keys complete and
mistakes show as the operator types. A value written as `${VAR}` is substituted by the loader, not the editor, so an
editor may flag it where a number is expected; check-config is the judge.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pipeline.config.app import AppConfig

SCHEMA_ID = "https://github.com/emotion-pipeline/emotion-pipeline/config/schema.json"


# A behaviour rule given in the file is merged into that emotion's built-in rule (behavior.settings), so none of
# these fields is required where an operator writes one.
MERGED_INTO_BUILT_INS = ("RuleConfig", "ExpressionConfig", "ToneConfig")


def config_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the whole configuration file."""
    schema = AppConfig.model_json_schema(mode="validation")
    for name in MERGED_INTO_BUILT_INS:
        schema.get("$defs", {}).get(name, {}).pop("required", None)
    _allow_substitution(schema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            **schema, "title": "emotion-pipeline configuration"}


def _allow_substitution(node: Any) -> None:
    """A string with a pattern (a camera name, an MQTT site) may also be a `${VAR}` the loader substitutes."""
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            node["pattern"] = f"(?:{node['pattern']})|\\$\\{{"
        for value in node.values():
            _allow_substitution(value)
    elif isinstance(node, list):
        for value in node:
            _allow_substitution(value)


def schema_text() -> str:
    return json.dumps(config_schema(), indent=2, sort_keys=False) + "\n"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (X, X | None, list[X], dict[str, X], unions of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for argument in typing.get_args(annotation):
        found.extend(_models_in(argument))
    return found


def _type_name(annotation: Any) -> str:
    """A short, readable type: `int`, `list[str]`, `"cpu" | "cuda"`, `CameraConfig`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(value) for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(argument) for argument in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is not None:
        arguments = ", ".join(_type_name(argument) for argument in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{arguments}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        return "(section)" if isinstance(value, BaseModel) else f"`{json.dumps(_plain(value))}`"
    if field.default is PydanticUndefined:
        return "**required**"
    value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(_plain(value))}`"


def _plain(value: Any) -> Any:
    """A default as YAML would write it: models as their fields, tuples as lists."""
    if isinstance(value, BaseModel):
        type_name = getattr(value, "type", None)
        kind = {"type": type_name} if isinstance(type_name, str) else {}
        return kind | value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _rows(model: type[BaseModel], prefix: str, sections: list[tuple[str, type[BaseModel]]]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
        for nested in _models_in(field.annotation):
            sections.append((key + _container(field.annotation), nested))
    return rows


def _container(annotation: Any) -> str:
    """How a nested model is reached under its key: `[]` in a list, `.<name>` in a mapping, nothing as a section."""
    origins = {typing.get_origin(annotation)} | {typing.get_origin(a) for a in typing.get_args(annotation)}
    if list in origins:
        return "[]"
    return ".<name>" if dict in origins else ""


def _title(prefix: str, model: type[BaseModel]) -> str:
    """A section's heading; one of several output kinds says its `type`."""
    kind = model.model_fields.get("type")
    literal = typing.get_args(kind.annotation) if kind is not None else ()
    return f"`{prefix}` (type: {literal[0]})" if len(literal) == 1 else f"`{prefix}`"


def markdown_reference() -> str:
    """docs/config.md: every key of every section, with its type, default and description."""
    out = ["# Configuration reference", "",
           "Generated from the pydantic models by `python run_pipeline.py schema --markdown docs/config.md` (do not",
           "edit by hand; the tests fail when it is stale). The same models give the JSON Schema in",
           "`config/schema.json`, which editors use to complete and check keys as you type. Validate a file with",
           "`python run_pipeline.py check-config FILE` (errors as `FILE:LINE: key: message`, exit 2). Unknown keys",
           "are errors; values may use `${VAR}` or `${VAR:-default}` from the environment.", ""]
    sections: list[tuple[str, type[BaseModel]]] = [("", AppConfig)]
    seen: set[tuple[str, type[BaseModel]]] = set()
    while sections:
        prefix, model = sections.pop(0)
        if (prefix, model) in seen:
            continue
        seen.add((prefix, model))
        title = _title(prefix, model) if prefix else "Top level"
        doc = " ".join((model.__doc__ or "").split())
        out += [f"## {title}", "", doc, "", "| key | type | default | description |", "|---|---|---|---|"]
        out += _rows(model, f"{prefix}." if prefix else "", sections)
        out.append("")
    return "\n".join(out)
