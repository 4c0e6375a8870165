"""The model catalog: the providers the model gateway may send a task to, their models and prices.

A provider speaks one API (`openai`- or `anthropic`-compatible), sits outside the platform or
inside it (`outside`), buys its tokens one way (`purchasing`) and lists its models with their
prices in USD per million tokens: input, cached input, output, and the batch prices. The packaged
catalog (`control_plane/catalog/models.yaml`) holds stand-in providers that the gateway starts
on loopback; `SINEWGRID_MODELS` points at another file. See docs/model-gateway.md.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from control_plane.catalog.yaml_files import read_yaml_mapping, validation_problems
from control_plane.settings import settings

DEFAULT_MODELS = Path(__file__).with_name("models.yaml")
MODELS_HOLDS = (
    "A model catalog is a YAML mapping with `prices_as_of` and `providers:`, each provider naming its `api` "
    "(openai or anthropic), `base_url`, `api_key_env`, `outside` and its `models:` with prices per million tokens "
    "(see docs/model-gateway.md)."
)
_NAME = re.compile(r"^[a-z][a-z0-9._-]{0,62}$")


class ModelCatalogError(ValueError):
    """A model catalog that cannot be used; the message names the file, the entry and the fix."""


class Purchasing(str, Enum):
    """How a provider's tokens are bought."""

    pay_as_you_go = "pay-as-you-go"
    committed = "committed"
    priority = "priority"
    batch = "batch"  # not a provider's mode: what a batch call is booked as


class StandInModelSpec(BaseModel):
    """How the stand-in imitates this model: the fraction of answers it gets right and its latency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quality: float = Field(0.9, ge=0, le=1)
    latency_ms: float = Field(0.0, ge=0)


class StandInSpec(BaseModel):
    """Start this provider as a stand-in on loopback (only where `base_url` is empty)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_seconds: float = Field(1.0, ge=0)
    outage: bool = False


class ModelSpec(BaseModel):
    """One model and its prices, USD per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(..., ge=0)
    cached_input: float | None = Field(None, ge=0, description="Input served from the provider's prompt cache; default: the input price.")
    output: float = Field(..., ge=0)
    batch_input: float | None = Field(None, ge=0, description="Input in a batch; default: the input price.")
    batch_output: float | None = Field(None, ge=0)
    rate_limit_rpm: int | None = Field(None, gt=0)
    standin: StandInModelSpec | None = None


class Provider(BaseModel):
    """One model provider."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    title: str = ""
    api: str = Field(..., pattern="^(openai|anthropic)$", description="The API it speaks: openai or anthropic (compatible).")
    base_url: str = Field("", description="Its API's address; empty with a `standin:` block: started on loopback.")
    api_key_env: str = Field("", description="The variable that holds its API key (never the key itself).")
    outside: bool = Field(True, description="Outside the platform: a tenant's data goes there only where its agreement allows.")
    purchasing: Purchasing = Purchasing.pay_as_you_go
    commit_discount: float = Field(0.2, ge=0, lt=1, description="What a commitment saves on pay-as-you-go prices.")
    priority_markup: float = Field(0.0, ge=0, description="What priority capacity costs on top of pay-as-you-go prices.")
    rate_limit_rpm: int | None = Field(None, gt=0)
    timeout_s: float = Field(30.0, gt=0)
    batch: bool | None = Field(None, description="Has the OpenAI-compatible Files and Batches APIs (default: every `openai` provider).")
    standin: StandInSpec | None = None
    models: dict[str, ModelSpec]

    @property
    def is_standin(self) -> bool:
        return self.standin is not None and not self.base_url

    @property
    def supports_batch(self) -> bool:
        """Batches go through the OpenAI-compatible Files and Batches APIs."""
        return self.batch if self.batch is not None else self.api == "openai"


class CatalogModel(BaseModel):
    """A model as the gateway routes to it: `provider/model`, its provider and its prices."""

    model_config = ConfigDict(frozen=True)

    provider: Provider
    name: str
    spec: ModelSpec

    @property
    def id(self) -> str:
        return f"{self.provider.name}/{self.name}"

    def price(self, kind: str, *, batch: bool = False) -> float:
        """USD per million tokens of `kind` (input, cached_input, output), at the batch price when `batch`."""
        s = self.spec
        if batch:
            value = {"input": s.batch_input if s.batch_input is not None else s.input, "output": s.batch_output if s.batch_output is not None else s.output}
            value["cached_input"] = value["input"]
        else:
            value = {"input": s.input, "cached_input": s.cached_input if s.cached_input is not None else s.input, "output": s.output}
        factor = 1.0
        if not batch and self.provider.purchasing is Purchasing.committed:
            factor = 1.0 - self.provider.commit_discount
        elif not batch and self.provider.purchasing is Purchasing.priority:
            factor = 1.0 + self.provider.priority_markup
        return value[kind] * factor

    def cost(self, tokens_in: int, tokens_out: int, tokens_cached: int = 0, *, batch: bool = False) -> float:
        """USD for one call: uncached input, cached input and output at this model's prices."""
        fresh = max(tokens_in - tokens_cached, 0)
        return (fresh * self.price("input", batch=batch) + tokens_cached * self.price("cached_input", batch=batch) + tokens_out * self.price("output", batch=batch)) / 1e6


class ModelCatalog(BaseModel):
    """Every provider and model the gateway may use, read from one file."""

    model_config = ConfigDict(frozen=True)

    file: str = ""
    prices_as_of: str = ""
    providers: dict[str, Provider]

    @property
    def models(self) -> list[CatalogModel]:
        return [CatalogModel(provider=p, name=n, spec=s) for p in self.providers.values() for n, s in p.models.items()]

    def model(self, model_id: str) -> CatalogModel:
        for m in self.models:
            if m.id == model_id:
                return m
        known = ", ".join(m.id for m in self.models)
        raise ModelCatalogError(f"model `{model_id}` is not in the model catalog {self.file} (it has: {known}). Use `provider/model` as listed there.")


def models_file() -> Path:
    configured = settings().models
    return Path(configured) if configured else DEFAULT_MODELS


def load_models(path: str | Path | None = None) -> ModelCatalog:
    """Read and validate a model catalog (default: `SINEWGRID_MODELS`, else the packaged one)."""
    path = Path(path) if path else models_file()
    raw = read_yaml_mapping(path, ModelCatalogError, "model catalog", MODELS_HOLDS)
    unknown = sorted(set(raw) - {"prices_as_of", "providers"})
    if unknown:
        raise ModelCatalogError(f"{path}: unknown section(s) {', '.join(unknown)}. {MODELS_HOLDS}")
    entries = raw.get("providers")
    if not isinstance(entries, dict) or not entries:
        raise ModelCatalogError(f"{path}: no `providers:` section, or it is empty. {MODELS_HOLDS}")
    providers = {}
    for name, entry in entries.items():
        if not _NAME.match(str(name)):
            raise ModelCatalogError(f"{path}: provider `{name}`: a name is lower-case letters, digits, '.', '_' and '-'. Rename it.")
        if not isinstance(entry, dict):
            raise ModelCatalogError(f"{path}: provider `{name}` must be a mapping of its fields, not {type(entry).__name__}. {MODELS_HOLDS}")
        try:
            provider = Provider(name=name, **entry)
        except ValidationError as exc:
            problems = validation_problems(exc, path, f"provider `{name}`", known=[f for f in Provider.model_fields if f != "name"])
            raise ModelCatalogError("invalid model catalog (docs/model-gateway.md):\n  " + "\n  ".join(problems)) from None
        if not provider.base_url and provider.standin is None:
            raise ModelCatalogError(f"{path}: provider `{name}` has no `base_url`. Give its API's address, or `standin: {{}}` to start a stand-in on loopback.")
        if not provider.models:
            raise ModelCatalogError(f"{path}: provider `{name}` lists no `models:`. Add at least one with its prices.")
        for model in provider.models:
            if not _NAME.match(model):
                raise ModelCatalogError(f"{path}: provider `{name}`: model `{model}`: use lower-case letters, digits, '.', '_' and '-'.")
        providers[name] = provider
    return ModelCatalog(file=str(path), prices_as_of=str(raw.get("prices_as_of", "")), providers=providers)
