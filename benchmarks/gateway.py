"""Figure 10: the model gateway's overhead per call (goal: at most 5 ms at p50 over a direct HTTP call).

Four ways of asking the same stand-in provider the same question, timed call by call in
alternation (ours, cache hit, SDK, direct, ours, …), each round with its own payload ``{"n": i}``:

* **ours**: ``ModelClient(catalog, addresses, cache_folder=None).complete(task, {"n": i}, [model],
  namespace="bench", cache=False)``, the gateway's whole per-call path through LiteLLM's Router
  (routing, cool-down checks, LiteLLM's ``completion``, the OpenAI SDK, cost, logging);
* **cache hit**: a second ``ModelClient`` with a response cache (``cache_folder`` set),
  ``cache=True`` and the same payload every time, so every timed call is answered from the cache:
  what a repeated prompt costs;
* **openai SDK**: ``openai.OpenAI(base_url=..., api_key="standin", max_retries=0)
  .chat.completions.create(model=name, **task.request(payload))``, the SDK LiteLLM is built on;
* **direct** (the baseline): an ``httpx.Client`` POST of ``{"model": name, **task.request(payload)}``
  to ``{base_url}/chat/completions`` with ``Authorization: Bearer standin`` on a kept-alive
  connection, then ``json.loads`` of the reply: what calling the provider yourself costs.

The provider is a stand-in (a real HTTP server on loopback, ``standin_hub.standin``) serving one
model with ``latency_ms: 0`` and ``quality: 1.0``, added to a copy of the packaged catalog (whose
own stand-ins are started too, as the gateway does); the task is ``tests/model_tasks/tell-parity``.
Its server (``http.server`` on a thread of this process) is in every column's time. Before timing,
the answers are checked right, the stand-in's request log must show the same request body from
ours, the SDK and the direct call, and the cache column must hit; after timing, the provider must
have served exactly the calls of the three uncached columns. Each column gets one untimed warm-up
call; ``gc.collect()`` runs before each repeat. After every call the loop pauses ``SETTLE_S``
outside the timed region, so that LiteLLM's logging thread (which goes on after the call returns)
is done before the next call starts instead of landing in it; ``CPU ms`` (``time.process_time``:
every thread of this process, the stand-in's included) takes the call and its pause.

Per repeat and column: p50 and p99 of the ``CALLS`` call times; the figure is the median of each
over the repeats. **Overhead** = ours − direct, at p50 and at p99.

``python -m benchmarks.gateway --profile`` profiles 200 calls of ours with cProfile.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml
from rich.table import Table

from benchmarks import REPEATS

CALLS = 200  # calls of each column per repeat
SETTLE_S = 0.003  # pause after every call, outside the timed region
GOAL_P50_MS = 5.0
PROVIDER, MODEL = "standin-bench", "zero-1"
TASK_FOLDER = Path(__file__).resolve().parents[1] / "tests" / "model_tasks" / "tell-parity"
HIT_PAYLOAD = {"n": -1}  # the cache column's one prompt
AUTH = {"Authorization": "Bearer standin"}
LABELS = {
    "ours": "ours: ModelClient.complete (LiteLLM Router), cache=False",
    "cache_hit": "ours, response cache hit (cache=True, same prompt)",
    "sdk": "openai SDK chat.completions.create",
    "direct": "direct: httpx POST + json.loads (baseline)",
}


@dataclass
class Column:
    name: str
    label: str
    seconds: list[list[float]] = field(default_factory=list)  # per repeat, every call's time
    cpu: list[float] = field(default_factory=list)  # per repeat, CPU seconds per call (all threads, with the pause)

    def each(self, q: float) -> list[float]:
        """The q-th percentile of each repeat's call times, in ms."""
        return [float(np.percentile(times, q)) * 1e3 for times in self.seconds]

    def ms(self, q: float) -> float:
        return statistics.median(self.each(q))

    @property
    def cpu_ms(self) -> float:
        return statistics.median(self.cpu) * 1e3

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "p50_ms": self.ms(50), "p99_ms": self.ms(99), "cpu_ms_per_call": self.cpu_ms,
            "p50_ms_each_repeat": self.each(50), "p99_ms_each_repeat": self.each(99),
            "cpu_ms_per_call_each_repeat": [c * 1e3 for c in self.cpu],
            "ms_each_call_each_repeat": [[round(s * 1e3, 4) for s in times] for times in self.seconds],
        }


@dataclass
class GatewayResult:
    columns: dict[str, Column]
    calls: int
    facts: dict[str, Any]

    def overhead(self, q: float, column: str = "ours") -> float:
        """ms that `column` adds over the direct call at the q-th percentile (difference of the medians)."""
        return self.columns[column].ms(q) - self.columns["direct"].ms(q)

    def to_dict(self) -> dict[str, Any]:
        ours, direct = self.columns["ours"], self.columns["direct"]
        return {
            "statistic": "median over repeats of each repeat's percentile of call times",
            "calls_per_repeat_per_column": self.calls, "settle_s": SETTLE_S, "goal_overhead_p50_ms": GOAL_P50_MS,
            "overhead_p50_ms": self.overhead(50), "overhead_p99_ms": self.overhead(99),
            "overhead_p50_ms_each_repeat": [a - b for a, b in zip(ours.each(50), direct.each(50))],
            "overhead_p99_ms_each_repeat": [a - b for a, b in zip(ours.each(99), direct.each(99))],
            "goal_met": self.overhead(50) <= GOAL_P50_MS,
            "columns": {name: column.to_dict() for name, column in self.columns.items()},
            **self.facts,
        }


def bench_catalog(folder: Path) -> Path:
    """The packaged catalog plus one stand-in provider (OpenAI API, no rate limit) serving one
    model that answers at once and always right; written to `folder`."""
    from control_plane.catalog.models import DEFAULT_MODELS

    raw = yaml.safe_load(DEFAULT_MODELS.read_text())
    raw["providers"][PROVIDER] = {
        "title": "Stand-in for the gateway benchmark: answers at once", "api": "openai",
        "api_key_env": "STANDIN_BENCH_API_KEY", "outside": False, "standin": {},
        "models": {MODEL: {"input": 0.1, "output": 0.4, "standin": {"quality": 1.0, "latency_ms": 0}}},
    }
    path = folder / "models.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Setup:
    """Stand-ins started on a temporary storage root, the two gateway clients, the SDK and httpx clients."""

    def __enter__(self) -> "Setup":
        import httpx
        import openai

        from control_plane.catalog.models import load_models
        from model_gateway.client import ModelClient
        from model_gateway.tasks import Task
        from testbed.model_providers import hub as standin_hub

        self.work = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-gateway-"))
        self.standins: dict[str, Any] = {}
        self.closing: list[Callable[[], Any]] = []
        try:
            self.catalog = load_models(bench_catalog(self.work))
            self.task = Task(TASK_FOLDER)
            root = str(self.work / "storage")
            for name, p in self.catalog.providers.items():
                if p.is_standin:
                    self.standins[name] = standin_hub.standin(p, root, [self.task])
            addresses = {name: (self.standins[name].base_url if name in self.standins else p.base_url) for name, p in self.catalog.providers.items()}
            self.provider = self.standins[PROVIDER]
            self.url = f"{self.provider.base_url}/chat/completions"
            self.model = self.catalog.model(f"{PROVIDER}/{MODEL}")
            self.ours = ModelClient(self.catalog, addresses, cache_folder=None)
            self.cached = ModelClient(self.catalog, addresses, cache_folder=self.work / "response-cache")
            self.http = httpx.Client(timeout=30)
            self.closing.append(self.http.close)
            self.sdk = openai.OpenAI(base_url=self.provider.base_url, api_key="standin", max_retries=0, timeout=30)
            self.closing.append(self.sdk.close)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        from model_gateway.client import litellm

        for close in self.closing:
            close()
        for provider in self.standins.values():
            provider.stop()
        litellm().cache = None  # the response cache is process-wide in LiteLLM; its folder goes now
        shutil.rmtree(self.work, ignore_errors=True)

    # The four columns: each takes n and returns the answer's text.
    def call_ours(self, n: int) -> str | None:
        call = self.ours.complete(self.task, {"n": n}, [self.model], namespace="bench", cache=False)
        return call.text if not call.error else call.error

    def call_cache_hit(self, n: int) -> str | None:
        return self.cached.complete(self.task, HIT_PAYLOAD, [self.model], namespace="bench", cache=True).text

    def call_sdk(self, n: int) -> str | None:
        return self.sdk.chat.completions.create(model=MODEL, **self.task.request({"n": n})).choices[0].message.content

    def call_direct(self, n: int) -> str | None:
        reply = self.http.post(self.url, json={"model": MODEL, **self.task.request({"n": n})}, headers=AUTH)
        return json.loads(reply.content)["choices"][0]["message"]["content"]

    def functions(self) -> dict[str, Callable[[int], Any]]:
        return {"ours": self.call_ours, "cache_hit": self.call_cache_hit, "sdk": self.call_sdk, "direct": self.call_direct}


def check(s: Setup) -> None:
    """Stop before timing unless every column answers right, ours, the SDK and the direct call send
    the same body, ours answers from the provider and the cache column from the cache."""
    call = s.ours.complete(s.task, {"n": 7}, [s.model], namespace="bench", cache=False)
    if call.error or call.cache_hit or call.model is None or call.model.id != s.model.id:
        raise RuntimeError(f"ours did not answer from {s.model.id}: {call}")
    texts = {"ours": call.text, "sdk": s.call_sdk(7), "direct": s.call_direct(7)}
    bodies = [entry["body"] for entry in s.provider.requests()[-3:]]
    expected = json.loads(json.dumps({"model": MODEL, **s.task.request({"n": 7})}))
    if len(bodies) != 3 or any(body != expected for body in bodies):
        raise RuntimeError(f"the stand-in did not get the same body from ours, the SDK and the direct call: {bodies} (expected {expected})")
    for name, text in texts.items():
        if not text or s.task.parse(text, {"n": 7}) != {"parity": "odd"}:
            raise RuntimeError(f"{name} answered {text!r} to n=7 (expected parity odd)")
    s.cached.complete(s.task, HIT_PAYLOAD, [s.model], namespace="bench", cache=True)
    if not s.cached.complete(s.task, HIT_PAYLOAD, [s.model], namespace="bench", cache=True).cache_hit:
        raise RuntimeError("the cache column's second call was not answered from the response cache")


def _served(s: Setup) -> int:
    return s.provider.served_tokens().get(MODEL, {}).get("calls", 0)


def run(repeats: int = REPEATS, calls: int = CALLS) -> GatewayResult:
    load_before = os.getloadavg()
    with Setup() as s:
        check(s)
        functions = s.functions()
        columns = {name: Column(name, LABELS[name]) for name in functions}
        numbers = itertools.count(1000)
        served_before = _served(s)
        for fn in functions.values():  # warm-up
            fn(next(numbers))
            time.sleep(SETTLE_S)
        for _ in range(repeats):
            times: dict[str, list[float]] = {name: [] for name in functions}
            cpu = dict.fromkeys(functions, 0.0)
            gc.collect()
            for _ in range(calls):
                n = next(numbers)
                for name, fn in functions.items():
                    cpu_start = time.process_time()
                    start = time.perf_counter()
                    fn(n)
                    times[name].append(time.perf_counter() - start)
                    time.sleep(SETTLE_S)
                    cpu[name] += time.process_time() - cpu_start
            for name, column in columns.items():
                column.seconds.append(times[name])
                column.cpu.append(cpu[name] / calls)
        served = _served(s) - served_before
        if served != 3 * calls * repeats + 3:  # ours, the SDK and direct; the cache column never reaches it
            raise RuntimeError(f"the stand-in served {served} calls, not {3 * calls * repeats + 3}: a column was answered from elsewhere")
        facts = {
            "provider": f"{PROVIDER}/{MODEL} (stand-in, latency_ms 0, Python http.server on loopback, in this process)",
            "task": "tests/model_tasks/tell-parity",
            "request_body_bytes": len(json.dumps({"model": MODEL, **s.task.request({"n": 1000})})),
            "provider_calls_timed": served,
            "versions": {name: metadata.version(name) for name in ("litellm", "openai", "httpx")},
            "load_average_1_5_15_before": list(load_before),
            "load_average_1_5_15_after": list(os.getloadavg()),
        }
    return GatewayResult(columns, calls, facts)


def table(result: GatewayResult, repeats: int) -> Table:
    over50, over99 = result.overhead(50), result.overhead(99)
    verdict = "met" if over50 <= GOAL_P50_MS else "NOT met"
    load = result.facts["load_average_1_5_15_before"][0], result.facts["load_average_1_5_15_after"][0]
    out = Table(
        title="10. Model gateway overhead per call: ModelClient.complete (LiteLLM Router) vs a direct httpx POST to the same stand-in",
        caption=(
            f"{result.calls} calls of each column per repeat, in alternation, distinct payloads; p50 and p99 of a repeat's call "
            f"times, median of {repeats} repeats (time.perf_counter). A {SETTLE_S * 1e3:.0f} ms pause after each call, outside "
            "the timing, lets LiteLLM's logging thread finish; CPU ms = process CPU time (all threads, the stand-in's server "
            f"included) per call and its pause. Overhead = ours − direct: {over50:.2f} ms at p50, {over99:.2f} ms at p99 "
            f"(goal ≤ {GOAL_P50_MS:.0f} ms at p50: {verdict}). Load average (1 min) {load[0]:.2f} before, {load[1]:.2f} after."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column, justify in (("Call", "left"), ("p50 ms", "right"), ("p99 ms", "right"), ("CPU ms/call", "right"),
                            ("+ p50 ms", "right"), ("+ p99 ms", "right")):
        out.add_column(column, justify=justify, style="bold" if column == "+ p50 ms" else None)
    for name, column in result.columns.items():
        extra = ("—", "—") if name == "direct" else (f"{result.overhead(50, name):+.2f}", f"{result.overhead(99, name):+.2f}")
        out.add_row(column.label, f"{column.ms(50):.2f}", f"{column.ms(99):.2f}", f"{column.cpu_ms:.2f}", *extra)
    return out


def profile(calls: int = 200, top: int = 30) -> None:
    """cProfile of `calls` calls of ours (after 20 warm-up calls, each call then a pause), by cumulative and own time."""
    import cProfile
    import pstats

    with Setup() as s:
        for n in range(20):
            s.call_ours(n)
        profiler = cProfile.Profile()
        for n in range(100, 100 + calls):
            profiler.enable()
            s.call_ours(n)
            profiler.disable()
            time.sleep(SETTLE_S)  # as in the figure: LiteLLM's logging thread finishes between calls
        stats = pstats.Stats(profiler)
        print(f"{calls} calls of ours under cProfile: {stats.total_tt / calls * 1e3:.2f} ms per call (the profiler slows "
              "Python code about 2×: read the shares). This thread only: LiteLLM's logging thread is not in it.")
        for order in ("cumulative", "tottime"):
            pstats.Stats(profiler).strip_dirs().sort_stats(order).print_stats(top)


def main() -> None:
    import argparse

    from rich.console import Console

    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--profile", action="store_true", help="profile 200 calls of ours with cProfile instead")
    args = parser.parse_args()
    if args.profile:
        profile()
    else:
        Console(width=160).print(table(run(args.repeats), args.repeats))


if __name__ == "__main__":
    main()
