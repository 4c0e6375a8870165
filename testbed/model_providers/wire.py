"""The few shapes the stand-in server and its API modules pass each other, and `Provider`: what
an API module may ask of the server (`server.StandInProvider` is one), so the API modules never
import the server that imports them."""

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from testbed.model_providers.skills import Answer


@dataclass
class Call:
    """One HTTP request as an API module sees it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case
    raw: bytes

    def json(self) -> Any:
        """The body as JSON (raises ValueError when it is not)."""
        return json.loads(self.raw.decode("utf-8") or "null")


@dataclass
class Reply:
    """What an API module answers, and what the log should say about the request."""

    status: int
    body: Any  # a JSON value, or bytes / str sent as they are
    headers: dict[str, str] = field(default_factory=dict)
    model: str | None = None  # the model the request named, for the log
    logged_body: Any = None  # the body to log when it is not the request's JSON (a file upload)
    content_type: str = "application/json"


@dataclass
class Served:
    """A completion the provider served: the answer and its token counts."""

    answer: Answer
    input_tokens: int  # all input tokens, cached ones included
    cached_tokens: int  # input tokens of a system prompt this provider had seen before
    output_tokens: int


@dataclass
class StandInModel:
    """One model a stand-in provider serves."""

    name: str  # the model id its API accepts, e.g. "swift-1"
    quality: float  # fraction of task answers that are right, 0..1 (deterministic per prompt)
    latency_ms: float = 0.0  # added to every answer


@dataclass
class StandInConfig:
    """A stand-in provider: its name, its API, its models and how it misbehaves."""

    name: str  # e.g. "standin-openai"
    api: Literal["openai", "anthropic"]
    models: list[StandInModel]
    rate_limit_rpm: int | None = None  # more requests than this in any 60 s window → 429
    outage: bool = False  # every call answers 503 (Anthropic: 529 overloaded_error)
    hang_seconds: float = 0.0  # sleep this long before answering (to cause client time-outs)
    batch_seconds: float = 1.0  # how long a batch takes from creation to completed / ended
    log_dir: Path | None = None  # where requests.jsonl goes (default: a temp folder the provider owns)


class Provider(Protocol):
    """What `openai_api` and `anthropic_api` use of a running stand-in."""

    config: StandInConfig
    store: dict[str, dict[str, Any]]

    def model(self, name: object) -> StandInModel | None: ...
    def model_names(self) -> list[str]: ...
    def admit(self) -> float | None: ...
    def wait(self, seconds: float) -> None: ...
    def serve(self, model: StandInModel, system: str, user: str, all_text: str, schema: Mapping | None) -> Served: ...
    def new_id(self, prefix: str) -> str: ...
    def run_later(self, seconds: float, work: Callable[[], None]) -> None: ...
    def log(self, method: str, path: str, model: object, body: Any, status: int, **extra: Any) -> None: ...
