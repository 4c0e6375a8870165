"""Tasks: named, versioned, provider-neutral work for a model, kept as files beside the lane that owns it.

A task folder holds `task.yaml` (name, version, quality bar, how answers are scored, batch or
online), `prompt.md` (the system prompt, first line `Task: <name> v<version>`), `schema.json`
(the answer's JSON Schema), `eval.jsonl` (its evaluation set) and optionally `tools.json`
(function tools, OpenAI's neutral format) and `verify.py` (a check of each answer). Nothing in it
names a provider: switching providers is a change to the model catalog, not to the task.

The gateway sends the prompt as the system message and the input as one fenced JSON block in
the user message, asks for the schema as structured output, and validates the answer with a
pydantic model built from the schema.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from control_plane.catalog.yaml_files import validation_problems

_TYPES: dict[str, type] = {"string": str, "number": float, "integer": int, "boolean": bool}


class TaskError(ValueError):
    """A task folder that cannot be used; the message names the file and the fix."""


class AnswerInvalid(ValueError):
    """A model's answer that does not fit the task's schema, or fails its verification."""


class TaskSpec(BaseModel):
    """`task.yaml`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., pattern=r"^[a-z][a-z0-9-]{1,62}$")
    version: int = Field(..., ge=1)
    title: str = ""
    kind: str = "labelling"
    quality_bar: float = Field(..., gt=0, le=1, description="The fraction of the evaluation set a model must answer right.")
    score: list[str] = Field(..., min_length=1, description="Answer fields compared exactly with the expected answer.")
    mode: Literal["online", "batch"] = "online"
    deadline_minutes: float | None = Field(None, gt=0)
    verify: str | None = None
    tools: str | None = None
    max_output_tokens: int = Field(300, gt=0)


class Task:
    """One task, read from its folder."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.spec = _read_spec(self.folder)
        self.prompt = _read_text(self.folder / "prompt.md")
        first = self.prompt.splitlines()[0].strip() if self.prompt.strip() else ""
        if first != self.header:
            raise TaskError(f"{self.folder / 'prompt.md'}: the first line must be `{self.header}` (it is `{first}`); it tells a model which task and version it answers.")
        self.schema = _read_json(self.folder / "schema.json")
        self.answer_model = answer_model(self.schema, self.spec.name, self.folder / "schema.json")
        missing = [f for f in self.spec.score if f not in self.answer_model.model_fields]
        if missing:
            raise TaskError(f"{self.folder / 'task.yaml'}: `score` names {', '.join(missing)}, which schema.json does not define.")
        self.tools = _read_json(self.folder / self.spec.tools) if self.spec.tools else None
        self._verify = _load_function(self.folder / self.spec.verify, "verify") if self.spec.verify else None

    # Names -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ref(self) -> str:
        """`label-failure@v1`: what the ledger books as the step and results are kept under."""
        return f"{self.spec.name}@v{self.spec.version}"

    @property
    def header(self) -> str:
        return f"Task: {self.spec.name} v{self.spec.version}"

    @property
    def fingerprint(self) -> str:
        """Changes when what is asked or how it is scored changes (prompt, schema, tools, evaluation
        set, scored fields): not with the bar, the mode or the deadline."""
        scoring = {"version": self.spec.version, "score": self.spec.score, "verify": self.spec.verify, "max_output_tokens": self.spec.max_output_tokens}
        parts = [self.prompt, json.dumps(self.schema, sort_keys=True), json.dumps(self.tools, sort_keys=True), json.dumps(scoring, sort_keys=True)]
        parts.append((self.folder / "eval.jsonl").read_text() if (self.folder / "eval.jsonl").exists() else "")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]

    # What is sent ------------------------------------------------------------------------
    def messages(self, payload: dict[str, Any]) -> list[dict[str, str]]:
        body = json.dumps(payload, sort_keys=True, indent=1, default=str)
        return [{"role": "system", "content": self.prompt}, {"role": "user", "content": f"```json\n{body}\n```"}]

    @property
    def response_format(self) -> dict[str, Any]:
        return {"type": "json_schema", "json_schema": {"name": self.spec.name.replace("-", "_"), "schema": self.schema, "strict": True}}

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The provider-neutral request (LiteLLM translates it for each provider's API)."""
        request: dict[str, Any] = {"messages": self.messages(payload), "response_format": self.response_format, "max_tokens": self.spec.max_output_tokens}
        if self.tools:
            request["tools"] = self.tools
        return request

    # What comes back ---------------------------------------------------------------------
    def parse(self, text: str | None, payload: dict[str, Any]) -> dict[str, Any]:
        """The answer as a dict, validated against the schema and (if the task declares one) verified."""
        if not text:
            raise AnswerInvalid(f"{self.ref}: the model returned no content")
        try:
            answer = self.answer_model.model_validate_json(_strip_fence(text)).model_dump()
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc, "the answer", most=5))
            raise AnswerInvalid(f"{self.ref}: the answer does not fit schema.json ({problems})") from None
        if self._verify is not None and (problem := self._verify(payload, answer)):
            raise AnswerInvalid(f"{self.ref}: verification failed: {problem}")
        return answer

    def is_right(self, answer: dict[str, Any], expected: dict[str, Any]) -> bool:
        return all(answer.get(f) == expected.get(f) for f in self.spec.score)

    def evaluation_set(self) -> list[dict[str, Any]]:
        path = self.folder / "eval.jsonl"
        rows = []
        for number, line in enumerate(_read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{path}: line {number} is not JSON ({exc.msg}); each line is {{\"id\", \"input\", \"expected\"}}.") from None
            if not isinstance(row, dict) or not {"input", "expected"} <= set(row):
                raise TaskError(f"{path}: line {number} lacks `input` or `expected`; each line is {{\"id\", \"input\", \"expected\"}}.")
            rows.append(row)
        if not rows:
            raise TaskError(f"{path}: the evaluation set is empty; a task needs examples with expected answers to be routed.")
        return rows


def answer_model(schema: dict[str, Any], name: str, where: Path | str = "schema.json") -> type[BaseModel]:
    """A pydantic model of a JSON Schema object whose properties are strings, numbers, integers,
    booleans, string enums or arrays of those."""
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        raise TaskError(f"{where}: the answer schema must be an object with `properties`.")
    required = set(schema.get("required", schema["properties"]))
    fields: dict[str, Any] = {}
    for field, prop in schema["properties"].items():
        kind = _field_type(prop, f"{where}: property `{field}`")
        fields[field] = (kind, ...) if field in required else (kind | None, None)
    return create_model(name.replace("-", "_").title().replace("_", ""), __config__=ConfigDict(extra="forbid"), **fields)


def _field_type(prop: dict[str, Any], where: str) -> Any:
    if "enum" in prop:
        return Literal[tuple(prop["enum"])]  # type: ignore[misc]
    kind = prop.get("type")
    if kind == "array":
        return list[_field_type(prop.get("items", {}), where + " items")]
    if kind not in _TYPES:
        raise TaskError(f"{where}: type {kind!r} is not supported; use string, number, integer, boolean, an enum or an array of those.")
    return _TYPES[kind]


def load_tasks(folder: str | Path) -> dict[str, Task]:
    """Every task folder (one holding `task.yaml`) under `folder`, by name."""
    tasks = {}
    for spec in sorted(Path(folder).glob("*/task.yaml")):
        task = Task(spec.parent)
        tasks[task.name] = task
    return tasks


def _read_spec(folder: Path) -> TaskSpec:
    path = folder / "task.yaml"
    try:
        raw = yaml.safe_load(_read_text(path))
        return TaskSpec.model_validate(raw)
    except yaml.YAMLError as exc:
        raise TaskError(f"{path}: not YAML ({exc})") from None
    except ValidationError as exc:
        problems = validation_problems(exc, path, known=TaskSpec.model_fields)
        raise TaskError("invalid task (docs/model-gateway.md, 'Tasks'):\n  " + "\n  ".join(problems)) from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskError(f"{path}: cannot read it ({exc.strerror}); a task folder holds task.yaml, prompt.md, schema.json and eval.jsonl.") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise TaskError(f"{path}: not JSON (line {exc.lineno}: {exc.msg}).") from None


def _load_function(path: Path, name: str) -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location(f"sinewgrid_task_{path.parent.name.replace('-', '_')}_{path.stem}", path)
    if spec is None or spec.loader is None or not path.exists():
        raise TaskError(f"{path}: task.yaml names it, but it does not exist.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, name, None)):
        raise TaskError(f"{path}: defines no function `{name}`.")
    return getattr(module, name)


def _strip_fence(text: str) -> str:
    text = text.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    return text
