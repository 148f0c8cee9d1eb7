"""`.github/fusebot.yml`: the repository's configuration, a pydantic model with a published JSON Schema.

Errors never crash the bot: `load_config` raises `ConfigError` whose problems each carry the file, the 1-based line
of the offending YAML node and a message, ready to become a check-run annotation.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import zoneinfo
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runner.contract import DType, SearchBudget

CONFIG_PATH = ".github/fusebot.yml"
DEFAULT_LABEL = "optimize-kernels"
DEFAULT_CRON = "0 3 * * *"
SCHEMA_URL = "https://github.com/fusebot/fusebot/blob/main/bot/schema/fusebot-config.schema.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Tolerance(_Strict):
    atol: float | None = Field(default=None, ge=0)
    rtol: float | None = Field(default=None, ge=0)


class TargetConfig(_Strict):
    """One module to optimise. Inputs come from a factory function, or from shapes and a dtype."""

    file: str = Field(description="Path of the Python file, relative to the repository root.")
    class_name: str = Field(alias="class", description="The nn.Module class to optimise.")
    name: str | None = Field(default=None, description="Target name; default: dotted module path + class.")
    inputs: str | None = Field(default=None, description="Input factory: a function in the same file or module:func.")
    init_inputs: str | None = Field(default=None, description="Factory of constructor arguments.")
    shapes: list[list[int]] | None = Field(default=None, description="Input shapes, when there is no factory.")
    dtype: DType | None = None
    init_args: list[Any] = Field(default_factory=list)
    init_kwargs: dict[str, Any] = Field(default_factory=dict)
    tolerance: Tolerance | None = None

    @field_validator("file")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/") or not v.endswith(".py"):
            raise ValueError("must be a relative path to a .py file inside the repository")
        return v

    @field_validator("class_name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not v.isidentifier():
            raise ValueError(f"{v!r} is not a Python class name")
        return v

    @model_validator(mode="after")
    def _inputs(self) -> TargetConfig:
        if self.inputs and self.shapes:
            raise ValueError("give either inputs (a factory) or shapes, not both")
        if self.shapes is not None and any(not s or any(d <= 0 for d in s) for s in self.shapes):
            raise ValueError("shapes must be lists of positive sizes")
        return self


class Schedule(_Strict):
    enabled: bool = True
    cron: str = Field(default=DEFAULT_CRON, description="Five-field cron expression, in `timezone`.")
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        if len(v.split()) != 5 or not croniter.is_valid(v):
            raise ValueError(f"{v!r} is not a five-field cron expression")
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        try:
            zoneinfo.ZoneInfo(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{v!r} is not an IANA time zone (e.g. Europe/Berlin)") from None
        return v


class FusebotConfig(_Strict):
    """The whole `.github/fusebot.yml`. Every field is optional: no file means these defaults plus source markers."""

    version: Literal[1] = 1
    trigger_label: str = Field(default=DEFAULT_LABEL, min_length=1, max_length=50)
    targets: list[TargetConfig] = Field(default_factory=list)
    markers: bool = Field(default=True, description="Also optimise classes marked `# fusebot: optimize`.")
    schedule: Schedule = Field(default_factory=Schedule)
    budget: SearchBudget = Field(default_factory=SearchBudget)
    models: list[str] = Field(default_factory=list, description="LLM models to propose ideas; empty: builtin.")
    kernels_dir: str = "fusebot_kernels"
    pr_grouping: Literal["per-target", "single"] = "per-target"
    ignore: list[str] = Field(default_factory=list, description="Glob patterns of paths never scanned.")

    @field_validator("budget")
    @classmethod
    def _budget(cls, v: SearchBudget) -> SearchBudget:
        if not v.wall_seconds > 0:
            raise ValueError(f"wall_seconds must be more than 0, not {v.wall_seconds:g}: it bounds each target's whole "
                             "run (baselines, search, confirmation)")
        return v

    @field_validator("kernels_dir")
    @classmethod
    def _dir(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/") or not re.fullmatch(r"[\w./-]+", v):
            raise ValueError("must be a relative directory inside the repository")
        return v


def json_schema() -> dict[str, Any]:
    schema = FusebotConfig.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_URL
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class ConfigProblem:
    path: str
    line: int  # 1-based
    message: str


class ConfigError(Exception):
    def __init__(self, problems: list[ConfigProblem]) -> None:
        super().__init__("; ".join(f"{p.path}:{p.line}: {p.message}" for p in problems))
        self.problems = problems


def _node_at(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """The deepest YAML node along pydantic's error location."""
    node = root
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    nxt = value
            if nxt is None:
                return node
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return node
    return node


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (through `X | None`, `list[X]`, `dict[str, X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (Union, types.UnionType, list, dict):
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose keys are valid at `loc` (a path of keys and list indexes from the top level)."""
    model: type[BaseModel] | None = FusebotConfig
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue  # an index into a list: the list's items are the same model
        field = next((f for name, f in model.model_fields.items() if part in (name, f.alias)), None)
        models = _models_in(field.annotation) if field is not None else []
        model = models[0] if models else None
    return model


def valid_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the config takes at `loc` (their YAML spelling: `class`, not `class_name`)."""
    model = _model_at(loc)
    return sorted(f.alias or name for name, f in model.model_fields.items()) if model is not None else []


def unknown_key_hint(loc: tuple[Any, ...]) -> str:
    """For an unknown key at `loc`: the nearest valid key at its level, or the valid keys when none is near."""
    keys = valid_keys(loc[:-1])
    if not keys:
        return ""
    near = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
    if near:
        return f" (did you mean `{near[0]}`?)"
    return " (valid keys here: " + ", ".join(f"`{k}`" for k in keys) + ")"


def line_of(text: str | None, loc: tuple[Any, ...]) -> int:
    """The 1-based line of the YAML node at `loc` (e.g. ("targets", 0, "class")) in `text`; 1 when not found."""
    try:
        node = _node_at(yaml.compose(text or "", Loader=yaml.SafeLoader), loc)
    except yaml.YAMLError:
        return 1
    return node.start_mark.line + 1 if node is not None else 1


def load_config(text: str | None, path: str = CONFIG_PATH) -> FusebotConfig:
    """Parse and validate. `None` (no file) gives the defaults."""
    if text is None or not text.strip():
        return FusebotConfig()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise ConfigError([ConfigProblem(path, line, f"YAML syntax error: {e.problem or e}")]) from None
    if data is None:
        return FusebotConfig()
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem(path, 1, "the file must be a YAML mapping (key: value)")])
    try:
        return FusebotConfig.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(err["loc"])
            node = _node_at(root, loc)
            line = node.start_mark.line + 1 if node is not None else 1
            where = ".".join(str(p) for p in loc) or "(top level)"
            unknown = err["type"] == "extra_forbidden" and loc  # pydantic's "Extra inputs are not permitted"
            message = f"unknown key{unknown_key_hint(loc)}" if unknown else err["msg"]
            problems.append(ConfigProblem(path, line, f"{where}: {message}"))
        raise ConfigError(problems) from None
