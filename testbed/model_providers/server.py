"""StandInProvider — a stand-in model provider on loopback, for demos and tests only.

It is a real HTTP server on 127.0.0.1 (the standard library's `ThreadingHTTPServer` on a
daemon thread, port picked by the OS) that speaks one provider's API — OpenAI-compatible
(`openai_api`) or Anthropic-compatible (`anthropic_api`) — and answers from task skills with
a known quality (`skills`). No model runs and nothing leaves the machine. Like a real
provider it can be slow (`latency_ms` per model, `hang_seconds` for the whole provider),
rate limited (`rate_limit_rpm`: more requests than that in any 60 s window are refused with
429) and down (`outage`: every call refused, 503 / Anthropic's 529), each switchable while it
runs (`set_outage`, `set_rate_limit`, `set_hang`), so a test can cause an outage mid-run.

Everything it receives is written, as it arrives, to `requests.jsonl` in its log folder (one
JSON object a line: time, provider, method, path, model, the full body, the status answered;
requests inside a batch too, with their batch and custom id). Another process can read the
file; a test reads it back with `requests()` to check what did — and what did not — reach a
provider.
"""

import json
import secrets
import shutil
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import testbed.model_providers.anthropic_api as anthropic_api
import testbed.model_providers.openai_api as openai_api
from testbed.model_providers.skills import Skill, count_tokens, respond
from testbed.model_providers.wire import Call, Reply, Served, StandInConfig, StandInModel

RATE_WINDOW_S = 60.0
_LOG_LOCK = threading.Lock()  # one writer at a time, even for providers sharing a log folder


class StandInProvider:
    """A stand-in provider: `with StandInProvider(config, skills) as base_url: ...`.

    `start()` returns the base URL to give LiteLLM as `api_base`: `http://127.0.0.1:PORT/v1`
    for the OpenAI API, `http://127.0.0.1:PORT` for the Anthropic API.
    """

    def __init__(self, config: StandInConfig, skills: Mapping[str, Skill] | None = None):
        self.config = config
        self.skills = dict(skills or {})
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._admitted: deque[float] = deque()  # times of the requests admitted in the last window
        self._seen_prefixes: set[str] = set()
        self._tokens: dict[str, dict[str, int]] = {}
        self._timers: list[threading.Timer] = []
        self.store: dict[str, dict[str, Any]] = {"files": {}, "batches": {}}  # the batch APIs' state
        if config.log_dir is None:
            owned = tempfile.mkdtemp(prefix=f"{config.name}-")
            weakref.finalize(self, shutil.rmtree, owned, ignore_errors=True)
            self.log_dir = Path(owned)
        else:
            self.log_dir = Path(config.log_dir)
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle -------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.log_dir / "requests.jsonl"

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"stand-in provider {self.config.name} is not started")
        root = f"http://127.0.0.1:{self._server.server_address[1]}"
        return f"{root}/v1" if self.config.api == "openai" else root

    def start(self) -> str:
        """Serve on a free loopback port; the base URL (LiteLLM's `api_base`)."""
        if self._server is None:
            self._stopping.clear()
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
            self._server.daemon_threads = True
            self._thread = threading.Thread(
                target=self._server.serve_forever, args=(0.05,), name=f"standin-{self.config.name}", daemon=True
            )
            self._thread.start()
        return self.base_url

    def stop(self) -> None:
        """Stop serving; hanging answers are cut short, pending batches never finish."""
        self._stopping.set()
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- misbehaving, switched at run time --------------------------------------------------

    def set_outage(self, outage: bool) -> None:
        self.config.outage = outage

    def set_rate_limit(self, rpm: int | None) -> None:
        with self._lock:
            self.config.rate_limit_rpm = rpm
            self._admitted.clear()

    def set_hang(self, seconds: float) -> None:
        self.config.hang_seconds = seconds

    # -- what it saw and served -------------------------------------------------------------

    def requests(self) -> list[dict]:
        """Every request this provider received so far, oldest first, read back from its log."""
        if not self.log_path.exists():
            return []
        with _LOG_LOCK:
            lines = self.log_path.read_text(encoding="utf-8").splitlines()
        entries = (json.loads(line) for line in lines if line.strip())
        return [e for e in entries if e.get("provider") == self.config.name]

    def served_tokens(self) -> dict[str, dict[str, int]]:
        """Tokens served so far, per model: {"input", "cached", "output", "calls"}."""
        with self._lock:
            return {model: dict(counts) for model, counts in self._tokens.items()}

    # -- for the API modules ----------------------------------------------------------------

    def model(self, name: object) -> StandInModel | None:
        return next((m for m in self.config.models if m.name == name), None)

    def model_names(self) -> list[str]:
        return [m.name for m in self.config.models]

    def admit(self) -> float | None:
        """Count one request against the rate limit: None if admitted, else the seconds to wait."""
        with self._lock:
            rpm, now = self.config.rate_limit_rpm, time.monotonic()
            while self._admitted and now - self._admitted[0] >= RATE_WINDOW_S:
                self._admitted.popleft()
            if rpm is not None and len(self._admitted) >= rpm:
                return max(RATE_WINDOW_S - (now - self._admitted[0]), 0.001) if self._admitted else RATE_WINDOW_S
            self._admitted.append(now)
            return None

    def wait(self, seconds: float) -> None:
        """Sleep, unless the provider stops first."""
        if seconds > 0:
            self._stopping.wait(seconds)

    def serve(self, model: StandInModel, system: str, user: str, all_text: str, schema: Mapping | None) -> Served:
        """Answer one prompt and count its tokens; a system prompt seen before counts as cached."""
        answer = respond(model.name, model.quality, system, user, schema, self.skills)
        schema_text = json.dumps(schema, sort_keys=True) if schema is not None else ""
        input_tokens = count_tokens(all_text + schema_text)
        with self._lock:
            cached = count_tokens(system) if system and system in self._seen_prefixes else 0
            if system:
                self._seen_prefixes.add(system)
            output_tokens = count_tokens(answer.text)
            counts = self._tokens.setdefault(model.name, {"input": 0, "cached": 0, "output": 0, "calls": 0})
            counts["input"] += input_tokens
            counts["cached"] += cached
            counts["output"] += output_tokens
            counts["calls"] += 1
        return Served(answer, input_tokens, min(cached, input_tokens), output_tokens)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{secrets.token_hex(12)}"

    def run_later(self, seconds: float, work: Callable[[], None]) -> None:
        """Run `work` on a daemon thread after `seconds` (a batch being processed)."""
        timer = threading.Timer(max(seconds, 0.0), work)
        timer.daemon = True
        with self._lock:
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def log(self, method: str, path: str, model: object, body: Any, status: int, **extra: Any) -> None:
        """Append one request to the log, flushed, so another process can read it at once."""
        entry = {
            "time": time.time(),
            "provider": self.config.name,
            "method": method,
            "path": path,
            "model": model if isinstance(model, str) else None,
            "body": body,
            "status": status,
            **extra,
        }
        line = json.dumps(entry, ensure_ascii=False, default=str) + "\n"
        with _LOG_LOCK, self.log_path.open("a", encoding="utf-8") as out:
            out.write(line)
            out.flush()

    # -- one HTTP request -------------------------------------------------------------------

    def handle(self, call: Call) -> Reply:
        """Hang, outage and authentication first (as a provider's front door would), then the API."""
        api = openai_api if self.config.api == "openai" else anthropic_api
        self.wait(self.config.hang_seconds)
        if self.config.outage:
            return api.outage()
        if not api.authorized(call):
            return api.error(401, "missing or empty API key (any non-empty key is accepted by a stand-in)")
        try:
            return api.route(self, call)
        except Exception as exc:  # a stand-in bug: answer 500 and keep serving
            return api.error(500, f"stand-in provider {self.config.name} failed: {exc!r}")


def _handler_for(provider: StandInProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the HTTP clients expect
        disable_nagle_algorithm = True  # headers and body leave at once: no 40 ms delayed-ACK stall per answer
        server_version = f"StandIn/{provider.config.name}"

        def _serve(self) -> None:
            url = urlsplit(self.path)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            call = Call(self.command, url.path, parse_qs(url.query), headers, raw)
            reply = provider.handle(call)
            provider.log(call.method, call.path, reply.model or _model_named(call), _logged(call, reply), reply.status)
            self._send(reply)

        def _send(self, reply: Reply) -> None:
            if isinstance(reply.body, bytes | str):
                data = reply.body.encode() if isinstance(reply.body, str) else reply.body
            else:
                data = json.dumps(reply.body, ensure_ascii=False).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a time-out)
                self.close_connection = True

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:  # the JSONL log is the log
            pass

    return Handler


def _model_named(call: Call) -> str | None:
    try:
        body = call.json()
    except ValueError:
        return None
    return body.get("model") if isinstance(body, dict) else None


def _logged(call: Call, reply: Reply) -> Any:
    if reply.logged_body is not None:
        return reply.logged_body
    if not call.raw:
        return None
    try:
        return call.json()
    except ValueError:
        return {"_raw": call.raw.decode("utf-8", errors="replace")}
