"""The configuration's JSON Schema and key reference (issue 26 item 2): generated from the pydantic models by
`python run_pipeline.py schema`, committed (config/schema.json, docs/config.md) and kept fresh, and the schema accepts
config/default.yaml and every example while refusing what the loader refuses."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from pipeline.config.schema import markdown_reference, schema_text
from tests.conftest import ROOT, run_cli

CONFIGS = [ROOT / "config" / "default.yaml", *sorted((ROOT / "config" / "examples").glob("*.yaml"))]


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((ROOT / "config" / "schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_committed_schema_and_reference_are_what_the_models_generate() -> None:
    assert (ROOT / "config" / "schema.json").read_text() == schema_text(), \
        "config/schema.json is stale: python run_pipeline.py schema --output config/schema.json --markdown docs/config.md"
    assert (ROOT / "docs" / "config.md").read_text() == markdown_reference(), \
        "docs/config.md is stale: python run_pipeline.py schema --output config/schema.json --markdown docs/config.md"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_schema_accepts_the_shipped_configs_and_they_point_editors_at_it(path: Path) -> None:
    text = path.read_text()
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in _validator().iter_errors(yaml.safe_load(text))]
    assert errors == []
    first = text.splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    assert (path.parent / first.split("$schema=", 1)[1].strip()).resolve() == (ROOT / "config" / "schema.json")


def test_schema_refuses_what_the_loader_refuses() -> None:
    validator = _validator()
    good = {"cameras": [{"name": "lobby", "source": "demo"}]}
    assert not list(validator.iter_errors(good))
    for bad in ({"cameras": [{"name": "lobby", "source": "demo"}], "detecter": {}},  # a typo
                {"cameras": [{"name": "lobby", "source": "demo", "fps": "fast"}]},  # a wrong type
                {"cameras": [{"name": "lobby", "source": "demo"}], "inference": {"device": "tpu"}},  # not a choice
                {"cameras": [{"name": "lobby", "source": "demo"}], "outputs": [{"type": "osc", "prot": 1}]}):
        assert list(validator.iter_errors(bad)), bad


def test_schema_command_prints_the_schema() -> None:
    done = run_cli("schema", timeout=60)
    assert done.returncode == 0, done.stderr[-1000:]
    assert json.loads(done.stdout)["title"] == "emotion-pipeline configuration"
