"""The few shapes the stand-in server and its API modules pass each other."""

import json
from dataclasses import dataclass, field
from typing import Any

from shared_resources.gateway.standins.skills import Answer


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
