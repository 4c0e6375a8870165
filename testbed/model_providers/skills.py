"""What a stand-in model "knows": task skills, and answers of known quality.

A real model reads the task's instructions and payload and answers, sometimes wrongly. A
stand-in model does the same deterministically: a **skill** knows a task's right answer
(`answer(payload)`) and a plausible wrong one (`wrong(payload)`), and a model of quality `q`
answers right for a payload iff

    int(sha256(model_name + "\\n" + canonical_json(payload)).hexdigest()[:8], 16) / 2**32 < q

so the same prompt always gets the same answer, and over many payloads the fraction right
tends to `q`. The gateway's prompt has the task in the first line of its system message
(`Task: <task-name> v<version>`) and the payload as the one fenced ```json block of its user
message. A prompt that names no known task gets a short generic, deterministic answer (and,
when a JSON schema was asked for, an object of placeholders that fits the schema), so plain
chat works too.

Tokens are counted as `ceil(len(text) / 4)`: no tokenizer, but the same text always costs the
same.
"""

import hashlib
import importlib.util
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASK_LINE = re.compile(r"^Task:\s*(?P<name>\S+)\s+v(?P<version>\S+)\s*$")
FENCED_JSON = re.compile(r"```json[ \t]*\r?\n(?P<body>.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Skill:
    """A task's right answer and a plausible wrong one, both functions of the payload."""

    answer: Callable[[dict], dict]
    wrong: Callable[[dict], dict]


def load_skill(path: Path) -> Skill:
    """The skill in a task folder's `standin_skill.py` (or that file itself), imported by path.

    The module has two module-level functions, `answer(payload) -> dict` and
    `wrong(payload) -> dict`.
    """
    path = Path(path)
    file = path / "standin_skill.py" if path.is_dir() else path
    digest = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"standin_skill_{digest}", file)
    if spec is None or spec.loader is None:
        raise ImportError(f"no stand-in skill at {file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("answer", "wrong"):
        if not callable(getattr(module, name, None)):
            raise ImportError(f"{file} defines no function {name}(payload) -> dict")
    return Skill(answer=module.answer, wrong=module.wrong)


def canonical_json(value: Any) -> str:
    """The one text of a JSON value that the quality draw hashes: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def answers_right(model_name: str, payload: dict, quality: float) -> bool:
    """Whether a model of this quality answers this payload right (deterministic)."""
    digest = hashlib.sha256(f"{model_name}\n{canonical_json(payload)}".encode()).hexdigest()
    return int(digest[:8], 16) / 2**32 < quality


def count_tokens(text: str) -> int:
    """The stand-in's token count of a text: a quarter of its characters, rounded up."""
    return math.ceil(len(text) / 4)


def task_of(system: str) -> tuple[str, str] | None:
    """(task name, version) named by the first line of a system message, if it names one."""
    first = system.strip().splitlines()[0] if system.strip() else ""
    found = TASK_LINE.match(first.strip())
    return (found["name"], found["version"]) if found else None


def payload_of(user: str) -> dict | None:
    """The JSON object in the user message's fenced ```json block (the last one, if several)."""
    blocks = FENCED_JSON.findall(user)
    if not blocks:
        return None
    try:
        value = json.loads(blocks[-1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def placeholder(schema: Mapping[str, Any], defs: Mapping[str, Any] | None = None) -> Any:
    """A value of the schema's type: every property of an object filled, arrays as short as allowed."""
    defs = defs if defs is not None else {**schema.get("$defs", {}), **schema.get("definitions", {})}
    if "$ref" in schema:
        return placeholder(defs.get(str(schema["$ref"]).rsplit("/", 1)[-1], {}), defs)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return placeholder(options[0], defs)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {name: placeholder(sub, defs) for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [placeholder(schema.get("items", {}), defs) for _ in range(int(schema.get("minItems", 0)))]
    return {"string": "stand-in", "integer": 0, "number": 0.0, "boolean": False, "null": None}.get(kind, "stand-in")


@dataclass(frozen=True)
class Answer:
    """What a stand-in model says: the text, and the object when the answer is JSON."""

    text: str
    data: dict | None = None
    task: str | None = None  # the task it answered, when it knew one
    right: bool | None = None  # whether it answered that task right


def respond(
    model_name: str,
    quality: float,
    system: str,
    user: str,
    schema: Mapping[str, Any] | None,
    skills: Mapping[str, Skill],
) -> Answer:
    """The answer of a model to a prompt: its skill's answer (right or wrong by the quality
    draw) for a known task with a payload, a deterministic generic answer otherwise."""
    task, payload = task_of(system), payload_of(user)
    if task is not None and task[0] in skills and payload is not None:
        right = answers_right(model_name, payload, quality)
        skill = skills[task[0]]
        data = skill.answer(payload) if right else skill.wrong(payload)
        return Answer(text=json.dumps(data, ensure_ascii=False), data=data, task=task[0], right=right)
    if schema is not None:
        data = placeholder(schema)
        return Answer(text=json.dumps(data, ensure_ascii=False), data=data if isinstance(data, dict) else None)
    digest = hashlib.sha256(f"{model_name}\n{system}\n{user}".encode()).hexdigest()[:8]
    return Answer(text=f"Stand-in answer {digest} from {model_name}: no task I know was asked.")
