"""The OpenAI-compatible API of a stand-in provider (base URL `http://127.0.0.1:PORT/v1`).

What it imitates, as much as LiteLLM's `openai/<model>` route and its file and batch calls use:

- `POST /v1/chat/completions`: a chat completion. Structured output
  (`response_format={"type": "json_schema", "json_schema": {"schema": ...}}`, which LiteLLM
  passes through unchanged) comes back as the JSON text in `choices[0].message.content`.
  `usage` is OpenAI's: `prompt_tokens` (cached ones included), `completion_tokens`, and
  `prompt_tokens_details.cached_tokens` for a system prompt this provider had seen before
  (LiteLLM: `response.usage.prompt_tokens_details.cached_tokens`).
- `POST /v1/files` (multipart, `purpose=batch`), `GET /v1/files/{id}`, `GET /v1/files/{id}/content`.
- `POST /v1/batches`, `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`: a batch is
  `validating`, then `in_progress`, and `completed` `batch_seconds` after it was made, with
  an output file of `{"id", "custom_id", "response": {"status_code", "body"}, "error"}` lines.
  Batches are not rate limited; each request in one is logged as it is processed.
- `GET /v1/models`.

Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`: 400 malformed JSON,
401 no `Authorization: Bearer <key>` (any non-empty key will do), 404 an unknown model (the
message names the models served), 429 over the rate limit (with `Retry-After`), 503 outage.
"""

import json
import time
from email import policy
from email.parser import BytesParser
from typing import Any

from testbed.model_providers.wire import Call, Provider, Reply

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}
ERROR_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}


def error(status: int, message: str, *, code: str | None = None, headers: dict | None = None, model: str | None = None) -> Reply:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": "model" if status == 404 else None, "code": code or ERROR_CODES.get(status)}}
    return Reply(status, body, headers=headers or {}, model=model)


def outage() -> Reply:
    return error(503, "The stand-in provider is down (a stand-in outage): the server is overloaded or not ready yet.")


def authorized(call: Call) -> bool:
    scheme, _, key = call.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(key.strip())


def route(provider: Provider, call: Call) -> Reply:
    parts = [p for p in call.path.split("/") if p]
    if parts[:1] != ["v1"]:
        return error(404, f"no route {call.method} {call.path} (the OpenAI API is under /v1)")
    match call.method, parts[1:]:
        case "POST", ["chat", "completions"]:
            return _chat(provider, call)
        case "GET", ["models"]:
            return Reply(200, {"object": "list", "data": [_model(n) for n in provider.model_names()]})
        case "POST", ["files"]:
            return _upload(provider, call)
        case "GET", ["files", file_id]:
            found = provider.store["files"].get(file_id)
            return Reply(200, found["meta"]) if found else error(404, f"no file {file_id}", code="file_not_found")
        case "GET", ["files", file_id, "content"]:
            found = provider.store["files"].get(file_id)
            if not found:
                return error(404, f"no file {file_id}", code="file_not_found")
            return Reply(200, found["content"], content_type="application/octet-stream")
        case "POST", ["batches"]:
            return _create_batch(provider, call)
        case "GET", ["batches", batch_id]:
            return _batch_reply(provider, batch_id)
        case "POST", ["batches", batch_id, "cancel"]:
            batch = provider.store["batches"].get(batch_id)
            if batch and batch["status"] not in ("completed", "cancelled"):
                batch.update(status="cancelled", cancelled_at=int(time.time()), cancelling_at=int(time.time()))
            return _batch_reply(provider, batch_id)
    return error(404, f"no route {call.method} {call.path}")


def _model(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "stand-in"}


def _text(content: Any) -> str:
    """The text of a message's content: a string, or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)


def _schema(body: dict) -> dict | None:
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
    return {"type": "object"} if fmt.get("type") == "json_object" else None


def completion(provider: Provider, body: Any, *, wait: bool) -> tuple[int, dict]:
    """Answer one chat completion request: (status, response body). Shared with batches."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return 400, error(400, "the body must be an object with a `messages` list").body
    model = provider.model(body.get("model"))
    if model is None:
        message = (f"The model `{body.get('model')}` does not exist on stand-in provider "
                   f"{provider.config.name}; it serves {', '.join(provider.model_names())}.")
        return 404, error(404, message).body
    messages = [m for m in body["messages"] if isinstance(m, dict)]
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    all_text = "\n".join(_text(m.get("content")) for m in messages)
    served = provider.serve(model, system, users[-1] if users else "", all_text, _schema(body))
    if wait:
        provider.wait(model.latency_ms / 1000)
    usage = {
        "prompt_tokens": served.input_tokens,
        "completion_tokens": served.output_tokens,
        "total_tokens": served.input_tokens + served.output_tokens,
        "prompt_tokens_details": {"cached_tokens": served.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    }
    choice = {"index": 0, "message": {"role": "assistant", "content": served.answer.text, "refusal": None},
              "logprobs": None, "finish_reason": "stop"}
    return 200, {"id": provider.new_id("chatcmpl-standin-"), "object": "chat.completion", "created": int(time.time()),
                 "model": model.name, "system_fingerprint": f"standin-{provider.config.name}",
                 "choices": [choice], "usage": usage}


def _chat(provider: Provider, call: Call) -> Reply:
    try:
        body = call.json()
    except ValueError:
        return error(400, "We could not parse the JSON body of your request (stand-in).")
    name = body.get("model") if isinstance(body, dict) else None
    retry_after = provider.admit()
    if retry_after is not None:
        message = f"Rate limit reached for {name} on stand-in provider {provider.config.name}: " \
                  f"limit {provider.config.rate_limit_rpm} requests per minute. Please try again in {retry_after:.1f}s."
        return error(429, message, headers={"Retry-After": str(max(1, round(retry_after)))}, model=name)
    status, answer = completion(provider, body, wait=True)
    return Reply(status, answer, model=name)


def _upload(provider: Provider, call: Call) -> Reply:
    """`POST /v1/files`: a multipart form with `purpose` and `file`."""
    head = f"Content-Type: {call.headers.get('content-type', '')}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    form = BytesParser(policy=policy.HTTP).parsebytes(head + call.raw)
    fields: dict[str, tuple[str | None, bytes]] = {}
    if form.is_multipart():
        for part in form.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[str(name)] = (part.get_filename(), part.get_payload(decode=True) or b"")
    if "file" not in fields:
        return error(400, "a file upload is a multipart form with `purpose` and `file`")
    filename, content = fields["file"]
    purpose = fields.get("purpose", (None, b""))[1].decode()
    meta = _store_file(provider, filename or "upload.jsonl", purpose, content)
    logged = {"purpose": purpose, "file": {"filename": filename, "content": content.decode("utf-8", errors="replace")}}
    return Reply(200, meta, logged_body=logged)


def _store_file(provider: Provider, filename: str, purpose: str, content: bytes) -> dict:
    meta = {"id": provider.new_id("file-standin-"), "object": "file", "bytes": len(content),
            "created_at": int(time.time()), "filename": filename, "purpose": purpose,
            "status": "processed", "expires_at": None, "status_details": None}
    provider.store["files"][meta["id"]] = {"meta": meta, "content": content}
    return meta


def _create_batch(provider: Provider, call: Call) -> Reply:
    try:
        body = call.json()
    except ValueError:
        return error(400, "We could not parse the JSON body of your request (stand-in).")
    found = provider.store["files"].get((body or {}).get("input_file_id"))
    if not found:
        return error(400, f"no input file {(body or {}).get('input_file_id')!r} on this provider", code="invalid_file")
    lines = [line for line in found["content"].decode("utf-8").splitlines() if line.strip()]
    now = int(time.time())
    batch = {
        "id": provider.new_id("batch_standin_"), "object": "batch", "endpoint": body.get("endpoint", "/v1/chat/completions"),
        "errors": None, "input_file_id": body["input_file_id"], "completion_window": body.get("completion_window", "24h"),
        "status": "validating", "output_file_id": None, "error_file_id": None, "created_at": now,
        "in_progress_at": None, "expires_at": now + 86400, "finalizing_at": None, "completed_at": None,
        "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": len(lines), "completed": 0, "failed": 0}, "metadata": body.get("metadata"),
        "_started": time.monotonic(),
    }
    provider.store["batches"][batch["id"]] = batch
    provider.run_later(provider.config.batch_seconds, lambda: _process(provider, batch, lines))
    return _batch_reply(provider, batch["id"])


def _process(provider: Provider, batch: dict, lines: list[str]) -> None:
    """Answer every request of a batch, log each, and complete it with an output file."""
    if batch["status"] == "cancelled":
        return
    out, completed, failed = [], 0, 0
    for line in lines:
        try:
            item = json.loads(line)
            request = item.get("body")
        except (ValueError, AttributeError):
            item, request = {}, None
        status, answer = completion(provider, request, wait=False)
        model = request.get("model") if isinstance(request, dict) else None
        provider.log("POST", item.get("url", batch["endpoint"]), model, request if request is not None else line,
                     status, batch_id=batch["id"], custom_id=item.get("custom_id"))
        completed, failed = completed + (status == 200), failed + (status != 200)
        out.append({"id": provider.new_id("batch_req_"), "custom_id": item.get("custom_id"),
                    "response": {"status_code": status, "request_id": provider.new_id("req_"), "body": answer},
                    "error": None})
    content = "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in out).encode()
    meta = _store_file(provider, f"{batch['id']}_output.jsonl", "batch_output", content)
    if batch["status"] != "cancelled":
        now = int(time.time())
        batch.update(status="completed", output_file_id=meta["id"], in_progress_at=batch["in_progress_at"] or now,
                     finalizing_at=now, completed_at=now,
                     request_counts={"total": len(lines), "completed": completed, "failed": failed})


def _batch_reply(provider: Provider, batch_id: str) -> Reply:
    batch = provider.store["batches"].get(batch_id)
    if batch is None:
        return error(404, f"no batch {batch_id}", code="batch_not_found")
    shown = {k: v for k, v in batch.items() if not k.startswith("_")}
    if shown["status"] in ("validating", "in_progress"):
        elapsed = time.monotonic() - batch["_started"]
        if elapsed >= provider.config.batch_seconds / 4:
            shown.update(status="in_progress", in_progress_at=shown["created_at"])
    return Reply(200, shown)
