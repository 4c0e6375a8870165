"""The gateway's one client for every provider: LiteLLM's Router, built from the model catalog.

Each catalog model is one Router deployment named `provider/model` (LiteLLM turns the neutral
request into that provider's API). The Router does what a gateway must not write by hand:
fallbacks to the next model of the route on rate limits, errors and time-outs (instead of
retrying the same one), cool-downs of a model that keeps failing, and the response cache
(LiteLLM's cache, kept on disk with `diskcache` so a repeated prompt costs no tokens across runs;
opt-in per call, one namespace per lane; the gateway never caches a tenant's answers).

What a call cost is worked out here from the catalog's prices and the usage the provider
reported (uncached input, cached input, output); LiteLLM is given the same prices, and its own
figure (`litellm_cost_usd`) is kept beside ours as a cross-check.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from control_plane.catalog.models import CatalogModel, ModelCatalog
from control_plane.settings import offline_litellm, provider_api_key
from model_gateway.tasks import Task

_IMPORT_LOCK = threading.Lock()


def litellm():
    """LiteLLM, imported on first use (it takes seconds), offline and quiet."""
    with _IMPORT_LOCK:
        offline_litellm()
        import litellm as module

        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
            logging.getLogger(name).setLevel(logging.ERROR)  # its notes on custom prices are noise here
        module.suppress_debug_info = True
        module.telemetry = False
        module.turn_off_message_logging = True  # its logs never hold prompts: the gateway's log decides what is kept
        return module


@dataclass
class Call:
    """One item's call: the answer text (or the error), who answered and what it cost."""

    text: str | None = None
    model: CatalogModel | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    cache_hit: bool = False
    cost_usd: float = 0.0
    litellm_cost_usd: float | None = None
    seconds: float = 0.0
    asked: str = ""  # the model the route asked first
    error: str = ""


def disk_cache(folder: Path):
    """LiteLLM's cache interface over a `diskcache` folder (LiteLLM 1.110 keeps only memory and
    remote caches; this keeps answers across the processes of several runs)."""
    import diskcache
    from litellm.caching.base_cache import BaseCache

    class DiskResponseCache(BaseCache):
        def __init__(self) -> None:
            super().__init__(default_ttl=7 * 24 * 3600)
            self.store = diskcache.Cache(str(folder))

        def set_cache(self, key, value, **kwargs):
            self.store.set(key, value, expire=kwargs.get("ttl") or self.default_ttl)

        async def async_set_cache(self, key, value, **kwargs):
            self.set_cache(key, value, **kwargs)

        async def async_set_cache_pipeline(self, cache_list, **kwargs):
            for key, value in cache_list:
                self.set_cache(key, value, **kwargs)

        def get_cache(self, key, **kwargs):
            return self.store.get(key)

        async def async_get_cache(self, key, **kwargs):
            return self.get_cache(key)

        async def disconnect(self):
            self.store.close()

    return DiskResponseCache()


class ModelClient:
    """The Router over every model of `catalog`, at `addresses` (provider → base URL)."""

    def __init__(self, catalog: ModelCatalog, addresses: dict[str, str], cache_folder: Path | None = None, *, cooldown_s: float = 30.0):
        lib = litellm()
        from litellm import Router
        from litellm.types.router import AllowedFailsPolicy, RetryPolicy

        self.catalog = catalog
        self.addresses = addresses
        model_list = [self._deployment(m) for m in catalog.models]
        # A failed call goes straight to the next model of the route: waiting to retry a provider
        # that is rate limited, down or slow only spends the caller's deadline. A model that fails
        # a second time within a minute cools down for `cooldown_s`: later calls skip it without
        # asking. (LiteLLM cools down past `allowed_fails`; the per-type policy is what makes it
        # cool down a model group of one deployment.)
        retries = RetryPolicy(RateLimitErrorRetries=0, TimeoutErrorRetries=0, InternalServerErrorRetries=0, ContentPolicyViolationErrorRetries=0, BadRequestErrorRetries=0)
        fails = AllowedFailsPolicy(RateLimitErrorAllowedFails=1, TimeoutErrorAllowedFails=1, InternalServerErrorAllowedFails=1)
        self.router = Router(
            model_list=model_list, retry_policy=retries, num_retries=0, retry_after=0, allowed_fails_policy=fails, cooldown_time=cooldown_s
        )
        if cache_folder is not None:
            cache_folder.mkdir(parents=True, exist_ok=True)
            # Process-wide in LiteLLM, so opt-in only: calls made without `caching=True` (anyone
            # else's in this process) are never answered from it.
            from litellm.caching.caching import CacheMode

            lib.cache = lib.Cache(type="local", mode=CacheMode.default_off, _backend=disk_cache(cache_folder))

    def _deployment(self, model: CatalogModel) -> dict[str, Any]:
        p = model.provider
        base = self.addresses.get(p.name, p.base_url)
        params: dict[str, Any] = {
            "model": f"{p.api}/{model.name}",
            "api_base": base,
            "api_key": provider_api_key(p.api_key_env) or ("standin" if p.is_standin else ""),
            "timeout": p.timeout_s,
            "max_retries": 0,  # the Router retries and falls back; the provider SDK's own retries would only wait
            "input_cost_per_token": model.price("input") / 1e6,
            "output_cost_per_token": model.price("output") / 1e6,
            "cache_read_input_token_cost": model.price("cached_input") / 1e6,
        }
        rpm = model.spec.rate_limit_rpm or p.rate_limit_rpm
        if rpm:
            params["rpm"] = rpm
        return {"model_name": model.id, "litellm_params": params, "model_info": {"id": model.id}}

    def complete(self, task: Task, payload: dict[str, Any], order: list[CatalogModel], *, namespace: str, cache: bool = True) -> Call:
        """Ask the first model of `order`; the Router falls back along the rest."""
        lib = litellm()
        request = task.request(payload)
        call = Call(asked=order[0].id)
        started = time.perf_counter()
        try:
            response = self.router.completion(
                model=order[0].id,
                fallbacks=[m.id for m in order[1:]],
                caching=cache,
                cache={"use-cache": True, "namespace": namespace} if cache else {"no-cache": True},
                **request,
            )
        except Exception as exc:  # every provider of the route failed: the item fails, the others go on
            call.seconds = time.perf_counter() - started
            call.error = _describe(exc, order)
            return call
        call.seconds = time.perf_counter() - started
        hidden = getattr(response, "_hidden_params", {}) or {}
        call.model = self.catalog.model(hidden.get("model_id") or order[0].id)
        call.text = response.choices[0].message.content
        call.cache_hit = bool(hidden.get("cache_hit"))
        if not call.cache_hit:
            usage = response.usage
            call.tokens_in, call.tokens_out = int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)
            details = getattr(usage, "prompt_tokens_details", None)
            call.tokens_cached = int(getattr(details, "cached_tokens", 0) or 0)
            call.cost_usd = call.model.cost(call.tokens_in, call.tokens_out, call.tokens_cached)
            call.litellm_cost_usd = hidden.get("response_cost")
        return call


def _describe(exc: Exception, order: list[CatalogModel]) -> str:
    kind = type(exc).__name__
    text = str(exc).splitlines()[0][:300] if str(exc) else kind
    return f"every model of the route failed ({', '.join(m.id for m in order)}); the last error: {kind}: {text}"
