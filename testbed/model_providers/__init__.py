"""Stand-in model providers — real HTTP servers on loopback that speak the OpenAI-compatible
and the Anthropic-compatible APIs, for demos and tests only (there are no real providers
here). They answer tasks from skills with a known quality, can be slow, rate limited or down,
and log every request they receive. See `server` for the provider, `openai_api` and
`anthropic_api` for what each API imitates, `skills` for the answers.

    with StandInProvider(StandInConfig("standin-openai", "openai", [StandInModel("swift-1", 0.8)]),
                         {"label-failure": load_skill(task_folder)}) as api_base:
        litellm.completion(model="openai/swift-1", api_base=api_base, api_key="standin", ...)

What the gateway should know, as LiteLLM 1.110.2 behaves against them:

- `api_base` is what `start()` returns: `http://127.0.0.1:PORT/v1` for `openai/<model>`
  (and for `litellm.create_file` / `create_batch` / `retrieve_batch` / `file_content` with
  `custom_llm_provider="openai"`), `http://127.0.0.1:PORT` for `anthropic/<model>` (LiteLLM
  adds `/v1/messages`; `retrieve_batch` / `file_content` with `custom_llm_provider="anthropic"`
  work on it too, a batch's id being its output file's id). Any non-empty `api_key` will do.
- Structured output comes back, for both APIs, as the JSON text of
  `choices[0].message.content`. For `anthropic/<model>` LiteLLM sends a forced tool call
  (`json_tool_call`) for a model it does not know, Anthropic's native `output_format` for a
  Claude model it knows (e.g. `claude-sonnet-4-5`); the stand-in answers either.
- Cached input tokens: `response.usage.prompt_tokens_details.cached_tokens` for both APIs
  (Anthropic's also as `response.usage.cache_read_input_tokens`); `usage.prompt_tokens`
  includes them for both.
- Errors: 429 → `litellm.RateLimitError`; an OpenAI outage (503) →
  `litellm.ServiceUnavailableError`, an Anthropic outage (529 `overloaded_error`) →
  `litellm.InternalServerError` with `status_code` 500; a hang past `timeout` →
  `litellm.Timeout`. The OpenAI SDK under LiteLLM retries 429 and 5xx twice by itself and
  waits out `Retry-After` (up to 60 s): pass `max_retries=0` to see them at once.
- Offline, set `LITELLM_LOCAL_MODEL_COST_MAP=True` and `LITELLM_OFFLINE_MODE=true` before
  importing LiteLLM (else it tries to download its price map and Anthropic's beta headers).
"""

from testbed.model_providers.server import StandInConfig, StandInModel, StandInProvider
from testbed.model_providers.skills import Skill, answers_right, canonical_json, count_tokens, load_skill

__all__ = [
    "Skill",
    "StandInConfig",
    "StandInModel",
    "StandInProvider",
    "answers_right",
    "canonical_json",
    "count_tokens",
    "load_skill",
]
