"""Batch work behind a deadline: the cheaper price when the answers can wait, never a missed deadline.

A task with `mode: batch` sends its items as one batch to the route's primary model through the
provider's batch API (OpenAI-compatible Files and Batches, called through LiteLLM) and is billed
at the catalog's batch prices. The gateway polls until the batch is done. If it is not done by
the deadline less a reserve (the time the items would take online), it cancels the batch and
returns what finished; the gateway answers the rest online along the route, at online prices, so
the deadline holds either way.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.catalog.models import CatalogModel
from control_plane.settings import provider_api_key
from model_gateway.client import Call, litellm
from model_gateway.tasks import Task

POLL_SECONDS = 0.5
DEFAULT_DEADLINE_MINUTES = 60.0


@dataclass
class BatchOutcome:
    """What came back from one batch: the finished calls by item id, and whether the deadline held."""

    batch_id: str
    status: str  # completed, or cancelled when the deadline came first
    seconds: float  # from upload to the last answer read back
    deadline_seconds: float
    calls: dict[str, Call] = field(default_factory=dict)

    @property
    def in_time(self) -> bool:
        return self.seconds <= self.deadline_seconds


def run_batch(
    task: Task,
    items: list[tuple[str, dict[str, Any]]],
    model: CatalogModel,
    base_url: str,
    *,
    deadline_minutes: float | None = None,
    online_seconds_per_item: float = 0.05,
) -> BatchOutcome:
    """Send `items` as one batch; the calls that finished, by item id (the others are left out)."""
    lib = litellm()
    provider = model.provider
    auth = {"custom_llm_provider": "openai", "api_base": base_url, "api_key": provider_api_key(provider.api_key_env) or ("standin" if provider.is_standin else "")}
    started = time.monotonic()
    deadline = started + 60.0 * (deadline_minutes or DEFAULT_DEADLINE_MINUTES)
    reserve = max(online_seconds_per_item * len(items), 0.1 * (deadline - started))
    lines = [
        json.dumps({"custom_id": item_id, "method": "POST", "url": "/v1/chat/completions", "body": {"model": model.name, **task.request(payload)}})
        for item_id, payload in items
    ]
    with tempfile.TemporaryDirectory(prefix="sinewgrid-batch-") as folder:
        path = Path(folder) / f"{task.name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        with path.open("rb") as handle:
            uploaded = lib.create_file(file=handle, purpose="batch", **auth)
    batch = lib.create_batch(completion_window="24h", endpoint="/v1/chat/completions", input_file_id=uploaded.id, **auth)
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        if time.monotonic() > deadline - reserve:
            batch = lib.cancel_batch(batch_id=batch.id, **auth)
            break
        time.sleep(POLL_SECONDS)
        batch = lib.retrieve_batch(batch_id=batch.id, **auth)
    outcome = BatchOutcome(batch_id=batch.id, status=batch.status, seconds=0.0, deadline_seconds=deadline - started)
    if not getattr(batch, "output_file_id", None):
        outcome.seconds = time.monotonic() - started
        return outcome
    content = lib.file_content(file_id=batch.output_file_id, **auth)
    text = content.content.decode() if hasattr(content, "content") else str(content)
    seconds = time.monotonic() - started
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        response = (entry.get("response") or {})
        if entry.get("error") or response.get("status_code") != 200:
            continue  # answered online instead
        body = response["body"]
        usage = body.get("usage") or {}
        tokens_in, tokens_out = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0)
        outcome.calls[entry["custom_id"]] = Call(
            text=body["choices"][0]["message"]["content"],
            model=model,
            asked=model.id,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            tokens_cached=cached,
            cost_usd=model.cost(tokens_in, tokens_out, cached, batch=True),
            seconds=seconds / max(len(items), 1),
        )
    outcome.seconds = time.monotonic() - started
    return outcome
