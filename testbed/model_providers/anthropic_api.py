"""The Anthropic-compatible API of a stand-in provider (base URL `http://127.0.0.1:PORT`).

What it imitates, as much as LiteLLM's `anthropic/<model>` route and the batch API use:

- `POST /v1/messages`: a message. Structured output arrives in one of the two forms LiteLLM
  makes of an OpenAI `response_format`: a forced tool call (a tool whose `input_schema` is the
  schema, `tool_choice={"type": "tool", "name": ...}`) answered with a `tool_use` block — which
  LiteLLM turns back into the JSON text of `choices[0].message.content` — or Anthropic's native
  `output_format` / `output_config.format` (`{"type": "json_schema", "schema": ...}`) answered
  with a text block of JSON. `usage` is Anthropic's: `input_tokens` leaves out the cached ones,
  `cache_read_input_tokens` counts a system prompt this provider had seen before (LiteLLM:
  `response.usage.cache_read_input_tokens`, and also `prompt_tokens_details.cached_tokens`;
  LiteLLM's `prompt_tokens` adds the cached tokens back in).
- `POST /v1/messages/batches`, `GET /v1/messages/batches/{id}`, `GET .../{id}/results`,
  `POST .../{id}/cancel`: a batch is `in_progress` and `ended` `batch_seconds` after it was
  made; its results are JSONL lines `{"custom_id", "result": {"type": "succeeded", "message"}}`.
  Batches are not rate limited; each request in one is logged as it is processed.
- `GET /v1/models`.

Errors are Anthropic's `{"type": "error", "error": {"type", "message"}}`: 400 malformed JSON,
401 no `x-api-key` (any non-empty key will do), 404 an unknown model (the message names the
models served), 429 `rate_limit_error` (with `retry-after`), 529 `overloaded_error` in an outage.
"""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from testbed.model_providers.wire import Call, Provider, Reply

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def error(status: int, message: str, *, headers: dict | None = None, model: str | None = None) -> Reply:
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}
    return Reply(status, body, headers=headers or {}, model=model)


def outage() -> Reply:
    return error(529, "Overloaded (a stand-in outage)")


def authorized(call: Call) -> bool:
    return bool(call.headers.get("x-api-key", "").strip())


def route(provider: Provider, call: Call) -> Reply:
    parts = [p for p in call.path.split("/") if p]
    match call.method, parts:
        case "POST", ["v1", "messages"]:
            return _messages(provider, call)
        case "GET", ["v1", "models"]:
            data = [{"type": "model", "id": n, "display_name": n, "created_at": "2025-01-01T00:00:00Z"}
                    for n in provider.model_names()]
            return Reply(200, {"data": data, "has_more": False, "first_id": None, "last_id": None})
        case "POST", ["v1", "messages", "batches"]:
            return _create_batch(provider, call)
        case "GET", ["v1", "messages", "batches", batch_id]:
            return _batch_reply(provider, call, batch_id)
        case "GET", ["v1", "messages", "batches", batch_id, "results"]:
            batch = provider.store["batches"].get(batch_id)
            if batch is None or batch["processing_status"] != "ended":
                return error(404 if batch is None else 400, f"batch {batch_id} has no results (yet)")
            return Reply(200, batch["_results"], content_type="application/binary")
        case "POST", ["v1", "messages", "batches", batch_id, "cancel"]:
            batch = provider.store["batches"].get(batch_id)
            if batch is not None and batch["processing_status"] == "in_progress":
                batch.update(processing_status="canceling", cancel_initiated_at=_iso())
            return _batch_reply(provider, call, batch_id)
    return error(404, f"no route {call.method} {call.path}")


def _iso(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).isoformat().replace("+00:00", "Z")


def _text(content: Any) -> str:
    """The text of a content field: a string, or blocks (text, tool_use input, tool_result)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else json.dumps(content)
    texts = []
    for block in content:
        if not isinstance(block, dict):
            texts.append(str(block))
        elif block.get("type") == "tool_use":
            texts.append(json.dumps(block.get("input"), sort_keys=True))
        elif block.get("type") == "tool_result":
            texts.append(_text(block.get("content")))
        else:
            texts.append(str(block.get("text", "")))
    return "\n".join(texts)


def _structure(body: dict) -> tuple[dict | None, str | None]:
    """(the schema asked for, the tool to answer with — None for a native JSON text answer)."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and "input_schema" in t]
    choice = body.get("tool_choice") if isinstance(body.get("tool_choice"), dict) else {}
    if choice.get("type") == "tool":
        tool = next((t for t in tools if t.get("name") == choice.get("name")), None)
        if tool is not None:
            return tool["input_schema"], tool["name"]
    if choice.get("type") == "any" and tools:
        return tools[0]["input_schema"], tools[0]["name"]
    native = body.get("output_format") or (body.get("output_config") or {}).get("format")
    if isinstance(native, dict) and native.get("type") == "json_schema":
        return native.get("schema") or {"type": "object"}, None
    if len(tools) == 1 and tools[0].get("name") == "json_tool_call":  # LiteLLM's unforced JSON tool
        return tools[0]["input_schema"], tools[0]["name"]
    return None, None


def message(provider: Provider, body: Any, *, wait: bool) -> tuple[int, dict]:
    """Answer one Messages request: (status, response body). Shared with batches."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return 400, error(400, "messages: field required (the body must be an object with a `messages` list)").body
    model = provider.model(body.get("model"))
    if model is None:
        note = f"model: {body.get('model')} (stand-in provider {provider.config.name} serves {', '.join(provider.model_names())})"
        return 404, error(404, note).body
    messages = [m for m in body["messages"] if isinstance(m, dict)]
    system = _text(body.get("system"))
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    all_text = "\n".join([system, *(_text(m.get("content")) for m in messages)])
    schema, tool = _structure(body)
    served = provider.serve(model, system, users[-1] if users else "", all_text, schema)
    if wait:
        provider.wait(model.latency_ms / 1000)
    if tool is not None:
        data = served.answer.data if served.answer.data is not None else json.loads(served.answer.text)
        content = [{"type": "tool_use", "id": provider.new_id("toolu_standin_"), "name": tool, "input": data}]
    else:
        content = [{"type": "text", "text": served.answer.text}]
    usage = {"input_tokens": served.input_tokens - served.cached_tokens, "output_tokens": served.output_tokens,
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": served.cached_tokens}
    return 200, {"id": provider.new_id("msg_standin_"), "type": "message", "role": "assistant", "model": model.name,
                 "content": content, "stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None,
                 "usage": usage}


def _messages(provider: Provider, call: Call) -> Reply:
    try:
        body = call.json()
    except ValueError:
        return error(400, "There was an error parsing the body of your request as JSON (stand-in).")
    name = body.get("model") if isinstance(body, dict) else None
    retry_after = provider.admit()
    if retry_after is not None:
        note = f"This request would exceed the rate limit of {provider.config.rate_limit_rpm} requests per minute " \
                  f"of stand-in provider {provider.config.name}; retry in {retry_after:.1f}s."
        return error(429, note, headers={"retry-after": str(max(1, round(retry_after)))}, model=name)
    status, answer = message(provider, body, wait=True)
    return Reply(status, answer, model=name)


def _create_batch(provider: Provider, call: Call) -> Reply:
    try:
        body = call.json()
    except ValueError:
        return error(400, "There was an error parsing the body of your request as JSON (stand-in).")
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not all(isinstance(r, dict) and "custom_id" in r for r in requests):
        return error(400, "requests: a list of {custom_id, params} is required")
    now = datetime.now(UTC)
    batch = {
        "id": provider.new_id("msgbatch_standin_"), "type": "message_batch", "processing_status": "in_progress",
        "request_counts": {"processing": len(requests), "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
        "ended_at": None, "created_at": _iso(now), "expires_at": _iso(now + timedelta(hours=24)),
        "archived_at": None, "cancel_initiated_at": None, "results_url": None, "_results": b"",
    }
    provider.store["batches"][batch["id"]] = batch
    provider.run_later(provider.config.batch_seconds, lambda: _process(provider, batch, requests))
    return _batch_reply(provider, call, batch["id"])


def _process(provider: Provider, batch: dict, requests: list[dict]) -> None:
    """Answer every request of a batch (or cancel it), log each, and end it with its results."""
    canceled = batch["processing_status"] == "canceling"
    lines, counts = [], {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    for request in requests:
        params = request.get("params")
        if canceled:
            result: dict = {"type": "canceled"}
        else:
            status, answer = message(provider, params, wait=False)
            model = params.get("model") if isinstance(params, dict) else None
            provider.log("POST", "/v1/messages", model, params, status,
                         batch_id=batch["id"], custom_id=request["custom_id"])
            result = {"type": "succeeded", "message": answer} if status == 200 else {"type": "errored", "error": answer}
        counts[result["type"]] += 1
        lines.append(json.dumps({"custom_id": request["custom_id"], "result": result}, ensure_ascii=False) + "\n")
    batch["_results"] = "".join(lines).encode()
    batch.update(processing_status="ended", ended_at=_iso(), request_counts=counts)


def _batch_reply(provider: Provider, call: Call, batch_id: str) -> Reply:
    batch = provider.store["batches"].get(batch_id)
    if batch is None:
        return error(404, f"no message batch {batch_id}")
    shown = {k: v for k, v in batch.items() if not k.startswith("_")}
    if shown["processing_status"] == "ended":
        host = call.headers.get("host", "127.0.0.1")
        shown["results_url"] = f"http://{host}/v1/messages/batches/{batch_id}/results"
    return Reply(200, shown)
