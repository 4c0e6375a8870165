"""The Pipes messages a workload sends the platform, typed, for both sides.

A workload reports with `Message.payload()` through `report_custom_message`; the platform reads
what arrived with `parse_messages`, which skips anything that is not one of these (other custom
messages, a newer workload's events). Every message carries `at`, the unix time the workload
stamped on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class Event(StrEnum):
    resumed = "resumed"  # the attempt starts work, from `step` (0, or the checkpoint it resumed)
    checkpoint = "checkpoint"  # work up to `step` is durable (a checkpoint, or committed output)
    progress = "progress"  # metrics at `step`, sent with each cadence checkpoint
    telemetry = "telemetry"  # mean seconds per step since the last report (the straggler detector reads it)
    preempted = "preempted"  # SIGTERM arrived; the checkpoint at `step` is safe and the workload exits 75
    qualified = "qualified"  # the qualification probe passed its checks
    data_read = "data_read"  # bytes of a dataset or checkpoint read, from the node cache and from the store


class BaseMessage(BaseModel):
    """What every message carries."""

    model_config = ConfigDict(frozen=True)

    at: float | None = None

    def payload(self) -> dict[str, Any]:
        """The JSON the workload sends."""
        return self.model_dump(mode="json", exclude_none=True)


class Resumed(BaseMessage):
    event: Literal[Event.resumed] = Event.resumed
    step: int = 0


class CheckpointSaved(BaseMessage):
    """Work made durable. Output-committing workloads add their own fields (e.g. `seed`)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    event: Literal[Event.checkpoint] = Event.checkpoint
    step: int
    committed_seconds: float = 0.0  # training time this attempt has saved so far (productive time)
    checkpoint_seconds: float | None = None  # time the write took (None: the workload committed its own output)
    uri: str | None = None
    final: bool = False


class Progress(BaseMessage):
    """Training metrics at a step, as extra fields (`loss=...`)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    event: Literal[Event.progress] = Event.progress
    step: int


class Telemetry(BaseMessage):
    """Mean seconds per step since the last report. A gang's rank 0 adds each rank's busy time
    per step (its step time less the time it waited for its peers) and the node of each rank."""

    event: Literal[Event.telemetry] = Event.telemetry
    step: int
    step_seconds: float
    rank_seconds: list[float] | None = None
    nodes: list[str] | None = None


class Preemption(BaseMessage):
    event: Literal[Event.preempted] = Event.preempted
    step: int | None = None


class Qualified(BaseMessage):
    event: Literal[Event.qualified] = Event.qualified
    checks: dict[str, str] = Field(default_factory=dict)
    node: str = ""
    # A gang's probe runs on every node: the nodes that failed a check, each with its problem.
    failed_nodes: dict[str, str] = Field(default_factory=dict)


class DataRead(BaseMessage):
    """What reading a dataset or a checkpoint cost: bytes found in the node cache (verified) and
    bytes read from the storage root (`workload_runtime/node_cache.py`)."""

    event: Literal[Event.data_read] = Event.data_read
    kind: Literal["dataset", "checkpoint"]
    uri: str
    cache_bytes: int = 0
    store_bytes: int = 0


Message = Annotated[Resumed | CheckpointSaved | Progress | Telemetry | Preemption | Qualified | DataRead, Field(discriminator="event")]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)
M = TypeVar("M", bound=BaseMessage)
_EVENTS = frozenset(e.value for e in Event)


def parse_messages(raw: Iterable[Any]) -> list[Message]:
    """The platform's messages among what a workload sent, in order; anything else is skipped."""
    parsed = []
    for item in raw:
        if isinstance(item, BaseMessage):
            parsed.append(item)
            continue
        if not isinstance(item, dict) or item.get("event") not in _EVENTS:
            continue
        try:
            parsed.append(_ADAPTER.validate_python(item))
        except ValidationError:
            continue
    return parsed


def of_kind(messages: Sequence[Any], kind: type[M]) -> list[M]:
    """The messages of one kind, e.g. `of_kind(messages, Telemetry)`."""
    return [m for m in messages if isinstance(m, kind)]
