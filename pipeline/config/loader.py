"""YAML with line marks, `${VAR}` substitution, and pydantic errors turned into `FILE:LINE: key.path: message`.

Kept apart from the models in `pipeline.config.app` so that those stay a readable description of the file. Nothing here
knows the configuration's schema: `issues_from_validation` walks whatever model class it is given.

Why our own node walk instead of `yaml.safe_load`: PyYAML forgets where each value came from once it builds Python
objects. Composing the node graph first and building the data ourselves keeps the line of every key and list item,
so an error can name the line an operator has to edit, and `${VAR}` can be replaced scalar by scalar without moving
any line.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.core.redact import mask_secrets
from pipeline.core.settings import MISSING, ConfigValueError, Loc

MAX_VALUE_CHARS = 80
"""A value echoed in `(got …)` is cut to this many characters, so one long line cannot drown the message."""

_ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
_SECRET_VAR = re.compile(r"PASS|PWD|SECRET|TOKEN|KEY|CRED", re.IGNORECASE)
_SECRET_KEY = re.compile(r"token|pass|secret|credential", re.IGNORECASE)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


def render_value(value: object) -> str:
    """Render a value for `(got …)`: credentials masked, strings quoted, at most MAX_VALUE_CHARS characters."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]  # YAML's words, not Python's
    text = repr(mask_secrets(value)) if isinstance(value, str) else mask_secrets(repr(value))
    if len(text) > MAX_VALUE_CHARS:
        text = text[: MAX_VALUE_CHARS - 3] + "..."
    return text


def dotted(path: Loc) -> str:
    """`("cameras", 1, "reconnect")` → `cameras[1].reconnect`: how an operator would point at the key."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a configuration file, located as precisely as the file allows."""

    file: str
    line: int | None
    key: str
    message: str
    value: object = MISSING

    def format(self) -> str:
        """`FILE:LINE: key.path: message (got VALUE)`; parts that are unknown are left out."""
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        text = f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        if self.value is not MISSING:
            text += f" (got {render_value(self.value)})"
        return text


class ConfigError(Exception):
    """Every problem found in one configuration file, so an operator can fix them all in one pass."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(issue.format() for issue in self.issues))


@dataclass
class LoadedYaml:
    """Plain data built from the YAML, with the 1-based line of every key path and what substitution found."""

    data: Any
    marks: dict[Loc, int] = field(default_factory=dict)
    issues: list[ConfigIssue] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # values of secret-looking variables, scrubbed from echoes
    skip: set[Loc] = field(default_factory=set)  # paths already reported (unset variable, unreadable tag)

    def line_for(self, path: Loc) -> int | None:
        """Line of `path`, or of its nearest ancestor present in the file (a missing key → its parent's line)."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return None


def read_config_text(path: Path) -> str:
    """Read a config file as UTF-8; any failure becomes a ConfigError, since an operator gets no traceback."""
    name = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError([ConfigIssue(name, None, "", "file not found")]) from None
    except IsADirectoryError:
        raise ConfigError([ConfigIssue(name, None, "", "is a directory, not a YAML file")]) from None
    except OSError as exc:
        raise ConfigError([ConfigIssue(name, None, "", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        message = f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8"
        raise ConfigError([ConfigIssue(name, line, "", message)]) from None


_INDENT_MISMATCH = ("the indentation of this line does not match the lines above it: keys of one section start in "
                    "the same column, and what belongs to a key is indented further than the key")
_LIST_ITEM_MISPLACED = ("this list item ('- ') is not indented like the lines above it: the '-' of every item of one "
                        "list starts in the same column, under a key that ends with ':'")
_MAPPING_VALUE_HINT = ("; this line is probably indented further than the line above it, or the line above lacks "
                       "the ':' after its key, or a value that contains ': ' needs quotes")
_MISSING_COLON = "this line has a key without its ':' (write `key: value`), or its indentation is wrong"


def _plain_problem(problem: str) -> tuple[str, bool] | None:
    """PyYAML's wording for the usual mistakes (mostly indentation) in an operator's words, and whether the mark to
    report is the one of the context (the line the mistake is on) rather than where the parser gave up.

    An operator cannot act on `expected <block end>, but found '<block mapping start>'`; they can on "this line is
    not indented like the lines above it". None: PyYAML's own wording is the best there is."""
    if problem.startswith("expected <block end>"):
        found = problem.rpartition("found ")[2]
        return (_LIST_ITEM_MISPLACED if found in ("'-'", "'<block sequence start>'") else _INDENT_MISMATCH), False
    if problem == "mapping values are not allowed here":
        return problem + _MAPPING_VALUE_HINT, False
    if problem == "could not find expected ':'":
        return _MISSING_COLON, True
    return None


def _syntax_issue(exc: yaml.YAMLError, filename: str) -> ConfigIssue:
    """One issue for a YAML syntax error, at the line the mistake is most likely on, in plain words where we can."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return ConfigIssue(filename, None, "", f"YAML error: {exc}")
    problem = exc.problem or "invalid YAML"
    mark = exc.problem_mark or exc.context_mark
    if "<stream end>" in problem and exc.context_mark:
        mark = exc.context_mark  # an unclosed bracket or quote: point where it opened, not past the last line
    plain = _plain_problem(problem)
    if plain is not None:
        text, at_context = plain
        if at_context and exc.context_mark:
            mark = exc.context_mark
        return ConfigIssue(filename, mark.line + 1 if mark else None, "", f"YAML syntax error: {text}")
    message = f"YAML syntax error: {problem}"
    if exc.context:
        context_line = f" at line {exc.context_mark.line + 1}" if exc.context_mark else ""
        message += f" ({exc.context}{context_line})"
    if "\\t" in problem or "\t" in problem:
        message += "; indent with spaces, not tabs"
    return ConfigIssue(filename, mark.line + 1 if mark else None, "", message)


class _Walker:
    """Builds plain Python data from a composed YAML node graph, recording marks and substituting `${VAR}`."""

    def __init__(self, filename: str, env: Mapping[str, str]) -> None:
        self.filename = filename
        self.env = env
        self.constructor = yaml.SafeLoader("")
        self.out = LoadedYaml(data=None)
        self._active: set[int] = set()

    def walk(self, node: yaml.Node, loc: Loc) -> Any:
        """Data for `node`; `loc` is its key path, whose line is recorded unless a key already claimed it."""
        self.out.marks.setdefault(loc, node.start_mark.line + 1)
        if id(node) in self._active:
            self._issue(node, loc, "an alias refers to itself (recursive anchors are not supported)")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, loc)
            if isinstance(node, yaml.SequenceNode):
                return [self.walk(item, loc + (index,)) for index, item in enumerate(node.value)]
            return self._scalar(node, loc)
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[str, Any]:
        """A mapping; keys are kept as written (`on:` stays "on"), duplicates and `<<` merges are handled."""
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                self._merge(value_node, loc, result)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self._issue(key_node, loc, "a key must be a plain name, not a list or mapping")
                continue
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in first_line:
                self._issue(key_node, loc + (key,), f"duplicate key (first defined at line {first_line[key]})")
            first_line.setdefault(key, line)
            self.out.marks[loc + (key,)] = line
            result[key] = self.walk(value_node, loc + (key,))
        return result

    def _merge(self, value_node: yaml.Node, loc: Loc, result: dict[str, Any]) -> None:
        """`<<: *anchor` — keys from the anchor fill in what the mapping does not set itself."""
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                self._issue(source, loc, "'<<' merges mappings only (use <<: *anchor of a mapping)")
                continue
            own_marks, self.out.marks = self.out.marks, {}
            merged = self._mapping(source, loc)
            merged_marks, self.out.marks = self.out.marks, own_marks
            for path, line in merged_marks.items():
                self.out.marks.setdefault(path, line)
            for key, value in merged.items():
                result.setdefault(key, value)

    def _scalar(self, node: yaml.ScalarNode, loc: Loc) -> Any:
        """A scalar typed by YAML rules; string scalars get `${VAR}` substituted and stay strings."""
        if node.tag == _STR_TAG and "${" in node.value:
            return self._substitute(node, loc)
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.out.skip.add(loc)
            self._issue(node, loc, f"cannot read this value: {getattr(exc, 'problem', None) or exc}")
            return None

    def _substitute(self, node: yaml.ScalarNode, loc: Loc) -> str:
        """Replace `${VAR}` / `${VAR:-default}` (default also when VAR is empty, as in the shell)."""

        def replace(match: re.Match[str]) -> str:
            name, default = match.group("name"), match.group("default")
            value = self.env.get(name)
            if value is None or (value == "" and default is not None):
                if default is None:
                    self.out.skip.add(loc)
                    self._issue(node, loc, f"environment variable {name} is not set "
                                           f"(export it, or write ${{{name}:-default}})")
                    return ""
                value = default
            if value and _SECRET_VAR.search(name):
                self.out.secrets.append(value)
            return value

        return _ENV_REF.sub(replace, node.value)

    def _issue(self, node: yaml.Node, loc: Loc, message: str) -> None:
        self.out.issues.append(ConfigIssue(self.filename, node.start_mark.line + 1, dotted(loc), message))


def load_yaml(text: str, filename: str, env: Mapping[str, str]) -> LoadedYaml:
    """Compose and walk one YAML document whose top level must be a mapping; syntax errors raise ConfigError."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError([_syntax_issue(exc, filename)]) from None
    if root is None:
        message = "the file is empty: expected a mapping of sections, at least `cameras:`"
        raise ConfigError([ConfigIssue(filename, 1, "", message)])
    if not isinstance(root, yaml.MappingNode):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else "a single value"
        message = f"the top level must be a mapping of sections (cameras:, detector:, …), not {kind}"
        raise ConfigError([ConfigIssue(filename, root.start_mark.line + 1, "", message)])
    walker = _Walker(filename, env)
    try:
        walker.out.data = walker.walk(root, ())
    except yaml.YAMLError as exc:
        raise ConfigError([_syntax_issue(exc, filename)]) from None
    return walker.out


# --- pydantic errors → issues ---------------------------------------------------------------------------------


def _data_path(loc: Loc, data: Any) -> Loc:
    """Map a pydantic `loc` onto the user's data: drop union branch/tag names and `[key]` markers."""
    path: list[str | int] = []
    current = data
    for index, part in enumerate(loc):
        if part == "[key]":
            continue
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
        elif isinstance(part, str) and index < len(loc) - 1:
            continue  # a union member or discriminator tag, not a key the user wrote
        else:
            current = None
        path.append(part)
    return tuple(path)


def _unwrap(annotation: Any, data: Any) -> Any:
    """Strip Annotated/Optional; pick the union member whose `type` literal matches the data's `type`."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin is typing.Union or origin is UnionType:
            models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
            tag = data.get("type") if isinstance(data, dict) else None
            tagged = [m for m in models if "type" in m.model_fields
                      and tag in typing.get_args(m.model_fields["type"].annotation)]
            chosen = tagged or models
            return chosen[0] if len(chosen) == 1 else None
        else:
            return annotation


def model_at(root: type[BaseModel], path: Loc, data: Any) -> type[BaseModel] | None:
    """The model class that validates the value at `path`, or None when it is not a model."""
    annotation: Any = root
    current = data
    for part in path:
        annotation = _unwrap(annotation, current)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            info = annotation.model_fields.get(str(part))
            if info is None:
                return None
            annotation = info.annotation
        elif typing.get_origin(annotation) in (list, tuple):
            annotation = typing.get_args(annotation)[0]
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        else:
            return None
        try:
            current = current[part]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            current = None
    annotation = _unwrap(annotation, current)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _yaml_kind(value: object) -> str:
    """How a YAML author would name the type of `value` (pydantic would say `NoneType`, `dict`)."""
    if value is None:
        return "an empty value"
    names = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list", dict: "a mapping"}
    return names.get(type(value), type(value).__name__)


def _quoted_list(text: str) -> str:
    """`"'a', 'b' or 'c'"` or `"True, False or 'c'"` (pydantic's wording) → `a, b, c` / `true, false, c` (booleans
    as YAML writes them)."""
    return ", ".join(quoted or plain.lower() for quoted, plain in re.findall(r"'([^']*)'|\b(True|False)\b", text))


def _message(error: Mapping[str, Any], root: type[BaseModel], path: Loc, data: Any) -> str:
    """An operator-friendly message for one pydantic error."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        model = model_at(root, path[:-1], data)
        allowed = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(path[-1]), allowed, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown key{hint} (allowed: {', '.join(allowed)})" if allowed else "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"must be one of: {_quoted_list(str(ctx.get('expected', '')))}"
    if kind == "union_tag_invalid":
        return f"unknown type (allowed: {_quoted_list(str(ctx.get('expected_tags', '')))})"
    if kind == "union_tag_not_found":
        return "required key is missing (it says which kind of entry this is)"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping (key: value lines), not {_yaml_kind(error.get('input'))}"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, not {_yaml_kind(error.get('input'))}"
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return re.sub(r"^(Input|String|List|Tuple|Dictionary|Value) should", "must", message)


def _echo(value: Any, path: Loc, secrets: list[str]) -> Any:
    """What may be echoed in `(got …)`: nothing for secret keys or whole mappings; secret env values scrubbed."""
    if value is MISSING or any(isinstance(p, str) and _SECRET_KEY.search(p) for p in path):
        return MISSING
    if isinstance(value, dict) or (
        isinstance(value, (list, tuple)) and not all(isinstance(v, (str, int, float, bool)) for v in value)
    ):
        return MISSING

    def scrub(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, (list, tuple)):
        return type(value)(scrub(v) if isinstance(v, str) else v for v in value)
    return value


def _issue_from_error(
    error: Mapping[str, Any], loaded: LoadedYaml, filename: str, root: type[BaseModel]
) -> ConfigIssue | None:
    """One pydantic error → one issue, or None when it only repeats an issue found while reading the YAML."""
    path = _data_path(tuple(error["loc"]), loaded.data)
    value = MISSING if error["type"] == "missing" else error.get("input", MISSING)
    exc = (error.get("ctx") or {}).get("error")
    if isinstance(exc, ConfigValueError):
        if path and any(skipped[: len(path)] == path for skipped in loaded.skip):
            return None  # a cross-field check of a model one of whose values came from an unset variable
        path, value = path + exc.key, exc.value
    elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        path = path + ("type",)
        value = (error.get("ctx") or {}).get("tag", MISSING)
    if any(path[:end] in loaded.skip for end in range(len(path) + 1)):
        return None
    message = _message(error, root, path, loaded.data)
    return ConfigIssue(filename, loaded.line_for(path), dotted(path), message, _echo(value, path, loaded.secrets))


def issues_from_validation(
    exc: ValidationError, loaded: LoadedYaml, filename: str, root: type[BaseModel]
) -> list[ConfigIssue]:
    """Every error of a pydantic validation, located in the YAML file."""
    issues = (_issue_from_error(e, loaded, filename, root) for e in exc.errors(include_url=False))
    return [issue for issue in issues if issue is not None]


def sort_issues(issues: list[ConfigIssue]) -> list[ConfigIssue]:
    """Issues in file order, each reported once (an anchor reused twice may fail twice at one line)."""
    seen: set[tuple[int | None, str, str]] = set()
    unique = []
    for issue in issues:
        if (issue.line, issue.key, issue.message) not in seen:
            seen.add((issue.line, issue.key, issue.message))
            unique.append(issue)
    return sorted(unique, key=lambda issue: (issue.line if issue.line is not None else 0))
