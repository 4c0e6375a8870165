"""Stand-in model providers: real HTTP on loopback, spoken to through LiteLLM (and httpx)."""

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

from testbed.model_providers import (
    Skill,
    StandInConfig,
    StandInModel,
    StandInProvider,
    answers_right,
    count_tokens,
    load_skill,
)

LABELS = ["oom", "network", "disk"]
SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": LABELS}, "confidence": {"type": "number"}},
    "required": ["label", "confidence"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "label_failure", "schema": SCHEMA, "strict": True}}
SYSTEM = "Task: label-failure v1\nLabel the failure of a training run from its last log lines."


def right(payload: dict) -> dict:
    return {"label": payload["truth"], "confidence": 0.9}


def wrong(payload: dict) -> dict:
    return {"label": LABELS[(LABELS.index(payload["truth"]) + 1) % len(LABELS)], "confidence": 0.4}


SKILLS = {"label-failure": Skill(answer=right, wrong=wrong)}


def messages(payload: dict, system: str = SYSTEM) -> list[dict]:
    user = f"Label this failure.\n\n```json\n{json.dumps(payload)}\n```\n"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@pytest.fixture(scope="module")
def litellm():
    """LiteLLM, imported once, offline: its price map and Anthropic beta headers from its own copy."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        mp.setenv("LITELLM_OFFLINE_MODE", "true")
        import litellm

        yield litellm


def provider(api: str, tmp_path, **config) -> StandInProvider:
    models = [StandInModel("swift-1", 0.8), StandInModel("steady-1", 1.0), StandInModel("claude-sonnet-4-5", 0.8)]
    return StandInProvider(StandInConfig(f"standin-{api}", api, models, log_dir=tmp_path, **config), SKILLS)


@pytest.fixture(params=["openai", "anthropic"])
def running(request, tmp_path) -> Iterator[StandInProvider]:
    with (stand_in := provider(request.param, tmp_path, batch_seconds=0.5)):
        yield stand_in


def call(litellm, stand_in: StandInProvider, model: str, msgs: list[dict], **kw):
    return litellm.completion(model=f"{stand_in.config.api}/{model}", api_base=stand_in.base_url, api_key="standin",
                              messages=msgs, max_retries=0, num_retries=0, **kw)


@pytest.mark.parametrize("model", ["swift-1", "claude-sonnet-4-5"])
def test_structured_output_comes_back_as_json_that_fits_the_schema(litellm, running, model):
    payload = {"log": "CUDA out of memory", "truth": "oom"}
    response = call(litellm, running, model, messages(payload), response_format=RESPONSE_FORMAT)
    answer = json.loads(response.choices[0].message.content)
    jsonschema.validate(answer, SCHEMA)
    assert answer == (right if answers_right(model, payload, 0.8) else wrong)(payload)
    sent = running.requests()[-1]
    assert (sent["method"], sent["model"], sent["status"]) == ("POST", model, 200)
    if running.config.api == "openai":
        assert sent["path"] == "/v1/chat/completions" and sent["body"]["response_format"] == RESPONSE_FORMAT
    elif model == "swift-1":  # a model LiteLLM does not know: a forced tool call
        assert sent["body"]["tool_choice"] == {"name": "json_tool_call", "type": "tool"}
        assert sent["body"]["tools"][0]["input_schema"] == SCHEMA
    else:  # a Claude model LiteLLM knows: Anthropic's native structured output
        assert sent["body"]["output_format"]["type"] == "json_schema"


def test_a_model_answers_right_as_often_as_its_quality_and_always_the_same(litellm, tmp_path):
    payloads = [{"log": f"run {i} died", "truth": LABELS[i % 3]} for i in range(200)]
    with (stand_in := provider("openai", tmp_path)):

        def label(payload: dict) -> dict:
            response = call(litellm, stand_in, "swift-1", messages(payload), response_format=RESPONSE_FORMAT)
            return json.loads(response.choices[0].message.content)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(label, payloads))
        again = [label(p) for p in payloads[:5]]
    share_right = sum(a == right(p) for a, p in zip(answers, payloads)) / len(payloads)
    assert 0.7 <= share_right <= 0.9
    assert again == answers[:5]
    assert all(a == (right(p) if answers_right("swift-1", p, 0.8) else wrong(p)) for a, p in zip(answers, payloads))


def test_plain_chat_gets_a_generic_answer_and_a_schema_without_a_task_gets_placeholders(litellm, running):
    hello = [{"role": "user", "content": "Hello there"}]
    first = call(litellm, running, "steady-1", hello).choices[0].message.content
    assert "Stand-in answer" in first and call(litellm, running, "steady-1", hello).choices[0].message.content == first
    filled = call(litellm, running, "steady-1", hello, response_format=RESPONSE_FORMAT).choices[0].message.content
    jsonschema.validate(json.loads(filled), SCHEMA)


def test_requests_beyond_the_rate_limit_are_refused_with_429(litellm, running):
    running.set_rate_limit(2)
    for i in range(2):
        call(litellm, running, "steady-1", messages({"truth": "disk", "i": i}))
    with pytest.raises(litellm.RateLimitError):
        call(litellm, running, "steady-1", messages({"truth": "disk", "i": 3}))
    raw = httpx.post(f"{running.base_url}/{'chat/completions' if running.config.api == 'openai' else 'v1/messages'}",
                     headers={"Authorization": "Bearer k", "x-api-key": "k"},
                     json={"model": "steady-1", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    assert raw.status_code == 429 and int(raw.headers["retry-after"]) >= 1
    kind = raw.json()["error"]["type"] if running.config.api == "anthropic" else raw.json()["error"]["code"]
    assert kind == {"openai": "rate_limit_exceeded", "anthropic": "rate_limit_error"}[running.config.api]
    running.set_rate_limit(None)
    call(litellm, running, "steady-1", messages({"truth": "disk", "i": 4}))
    assert [r["status"] for r in running.requests()] == [200, 200, 429, 429, 200]


def test_an_outage_mid_run_refuses_every_call_until_it_is_over(litellm, running):
    call(litellm, running, "steady-1", messages({"truth": "oom"}))
    running.set_outage(True)
    family = {"openai": litellm.ServiceUnavailableError, "anthropic": litellm.InternalServerError}[running.config.api]
    with pytest.raises(family) as refused:
        call(litellm, running, "steady-1", messages({"truth": "oom"}))
    # LiteLLM keeps OpenAI's 503, but makes Anthropic's 529 (overloaded_error) a 500.
    assert refused.value.status_code == {"openai": 503, "anthropic": 500}[running.config.api]
    running.set_outage(False)
    call(litellm, running, "steady-1", messages({"truth": "oom"}))
    answered = {"openai": 503, "anthropic": 529}[running.config.api]
    assert [r["status"] for r in running.requests()] == [200, answered, 200]


def test_a_hanging_provider_makes_the_client_time_out(litellm, running):
    running.set_hang(5.0)
    with pytest.raises(litellm.Timeout):
        call(litellm, running, "steady-1", messages({"truth": "oom"}), timeout=0.3)


def test_a_system_prompt_seen_before_is_reported_as_cached(litellm, running):
    first = call(litellm, running, "swift-1", messages({"truth": "oom", "n": 1}), response_format=RESPONSE_FORMAT)
    second = call(litellm, running, "steady-1", messages({"truth": "disk", "n": 2}), response_format=RESPONSE_FORMAT)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == count_tokens(SYSTEM)
    if running.config.api == "anthropic":
        assert (first.usage.cache_read_input_tokens, second.usage.cache_read_input_tokens) == (0, count_tokens(SYSTEM))
    served = running.served_tokens()
    assert served["steady-1"]["cached"] == count_tokens(SYSTEM) and served["swift-1"]["cached"] == 0
    assert second.usage.completion_tokens == math.ceil(len(second.choices[0].message.content) / 4)


def test_an_openai_batch_round_trip_through_litellm(litellm, tmp_path):
    payloads = [{"log": f"secret-batch-{i}", "truth": "network"} for i in range(3)]
    lines = [{"custom_id": f"job-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "steady-1", "messages": messages(p), "response_format": RESPONSE_FORMAT}}
             for i, p in enumerate(payloads)]
    (jsonl := tmp_path / "batch-input.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with (stand_in := provider("openai", tmp_path / "log", batch_seconds=0.5)) as api_base:
        reach = {"custom_llm_provider": "openai", "api_base": api_base, "api_key": "standin"}
        with jsonl.open("rb") as file:
            uploaded = litellm.create_file(file=file, purpose="batch", **reach)
        batch = litellm.create_batch(completion_window="24h", endpoint="/v1/chat/completions",
                                     input_file_id=uploaded.id, **reach)
        assert batch.status in ("validating", "in_progress")
        deadline = time.monotonic() + 20
        while batch.status != "completed" and time.monotonic() < deadline:
            time.sleep(0.1)
            batch = litellm.retrieve_batch(batch_id=batch.id, **reach)
        assert batch.status == "completed" and batch.request_counts.completed == 3
        output = litellm.file_content(file_id=batch.output_file_id, **reach).content.decode()
    results = {r["custom_id"]: r for r in map(json.loads, output.splitlines())}
    for i, payload in enumerate(payloads):
        response = results[f"job-{i}"]["response"]
        assert response["status_code"] == 200
        assert json.loads(response["body"]["choices"][0]["message"]["content"]) == right(payload)
    inner = [r for r in stand_in.requests() if r.get("batch_id") == batch.id]
    assert sorted(r["custom_id"] for r in inner) == ["job-0", "job-1", "job-2"]


def test_an_anthropic_batch_round_trip(litellm, tmp_path):
    payloads = [{"log": f"batch-{i}", "truth": "disk"} for i in range(3)]
    requests = [{"custom_id": f"job-{i}", "params": {"model": "steady-1", "max_tokens": 100, "system": SYSTEM,
                                                      "messages": messages(p)[1:]}} for i, p in enumerate(payloads)]
    with (stand_in := provider("anthropic", tmp_path, batch_seconds=0.5)) as api_base:
        client = httpx.Client(base_url=api_base, headers={"x-api-key": "standin", "anthropic-version": "2023-06-01"})
        batch = client.post("/v1/messages/batches", json={"requests": requests}).json()
        assert batch["processing_status"] == "in_progress"
        deadline = time.monotonic() + 20
        while batch["processing_status"] != "ended" and time.monotonic() < deadline:
            time.sleep(0.1)
            batch = client.get(f"/v1/messages/batches/{batch['id']}").json()
        assert batch["processing_status"] == "ended" and batch["request_counts"]["succeeded"] == 3
        results = [json.loads(line) for line in client.get(batch["results_url"]).text.splitlines()]
        # LiteLLM reads the same batch back in OpenAI's shape; its output file is the results.
        seen = litellm.retrieve_batch(batch_id=batch["id"], custom_llm_provider="anthropic", api_base=api_base,
                                      api_key="standin")
        assert seen.status == "completed" and seen.request_counts.completed == 3
    for result, payload in zip(sorted(results, key=lambda r: r["custom_id"]), payloads):
        assert result["result"]["type"] == "succeeded"
        assert json.loads(result["result"]["message"]["content"][0]["text"]) == right(payload)
    assert len([r for r in stand_in.requests() if r.get("batch_id") == batch["id"]]) == 3


def test_the_request_log_holds_every_body(litellm, running):
    secret = "patient-7731-SECRET"
    call(litellm, running, "steady-1", messages({"truth": "oom", "note": secret}))
    call(litellm, running, "steady-1", messages({"truth": "oom", "note": "nothing to see"}))
    logged = running.requests()
    assert len(logged) == 2 and all({"time", "method", "path", "model", "body", "status"} <= set(r) for r in logged)
    assert secret in json.dumps(logged[0]["body"]) and secret not in json.dumps(logged[1]["body"])
    assert secret in running.log_path.read_text()  # the file itself, as another process would read it


def test_unknown_models_malformed_bodies_and_missing_keys_are_refused(running):
    api = running.config.api
    path = "/chat/completions" if api == "openai" else "/v1/messages"
    key = {"Authorization": "Bearer k"} if api == "openai" else {"x-api-key": "k"}
    body = {"model": "nope-9", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    unknown = httpx.post(running.base_url + path, headers=key, json=body)
    assert unknown.status_code == 404 and "nope-9" in unknown.text and "swift-1" in unknown.text
    malformed = httpx.post(running.base_url + path, headers={**key, "content-type": "application/json"}, content=b"{oops")
    assert malformed.status_code == 400
    anonymous = httpx.post(running.base_url + path, json={**body, "model": "swift-1"})
    assert anonymous.status_code == 401
    kind = {"openai": lambda r: r.json()["error"]["code"], "anthropic": lambda r: r.json()["error"]["type"]}[api]
    assert kind(anonymous) == {"openai": "invalid_api_key", "anthropic": "authentication_error"}[api]
    assert [r["status"] for r in running.requests()] == [404, 400, 401]


def test_a_skill_is_loaded_from_a_task_folder(tmp_path):
    folder = tmp_path / "count-words"
    folder.mkdir()
    (folder / "standin_skill.py").write_text(
        "def answer(payload):\n    return {'words': len(payload['text'].split())}\n\n"
        "def wrong(payload):\n    return {'words': len(payload['text'].split()) + 1}\n"
    )
    skill = load_skill(folder)
    assert skill.answer({"text": "a b c"}) == {"words": 3} and skill.wrong({"text": "a b c"}) == {"words": 4}
