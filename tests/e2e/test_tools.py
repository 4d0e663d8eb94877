"""Tool calling and structured output with the official `openai` client
against a real `kvant serve`. For every tool-call format the server is
started with a chat template that writes it (tests/fixtures/jinja/templates)
and the format found from that template (or named with --tool-parser); a
forced call (tool_choice "required" or a named function) must come back as
OpenAI tool_calls, the same streamed and whole, and the conversation must
go on with the call and its result in the history. The default model does
not know these formats: the constraint writes the layout, the parser reads
it back. Structured output (json_schema, json_object, regex, choice) must
parse and fit its schema."""
import json
import os

import openai
import pytest

from kvant_server import MODEL_ID, Server

TEMPLATES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "jinja", "templates")

# (name, template, extra server flags, chat_template_kwargs). DeepSeek's
# markers (full-width bars, U+2581) take the default model many byte tokens.
FORMATS = [
    ("hermes", "qwen3.jinja", [], {"enable_thinking": False}),
    ("qwen3_coder", "qwen3_coder.jinja", [], {}),
    ("llama3_json", "llama3.1.jinja", [], {}),
    ("deepseek_v31", "deepseek_v3.1.jinja", [], {}),
    ("deepseek_v3", "deepseek_v3.1.jinja", ["--tool-parser", "deepseek_v3"], {}),
    ("kimi_k2", "kimi_k2_instruct.jinja", [], {}),
    ("glm45", "glm4.6.jinja", [], {"enable_thinking": False}),
    ("glm47", "glm4.7_flash.jinja", [], {"enable_thinking": False}),
]
MAX_TOKENS = {"deepseek_v31": 420, "deepseek_v3": 420}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


@pytest.fixture(scope="module", params=FORMATS, ids=[f[0] for f in FORMATS])
def fmt(request):
    name, template, flags, kwargs = request.param
    with Server("--chat-template", os.path.join(TEMPLATES, template), *flags) as s:
        client = openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)
        yield name, client, kwargs, s


def check_call(call, only=None):
    assert call.type == "function"
    assert call.id
    args = json.loads(call.function.arguments)
    if only:
        assert call.function.name == only
    if call.function.name == "get_weather":
        assert args["city"] in ("Paris", "Oslo")
        assert 1 <= args["days"] <= 7
    else:
        assert call.function.name == "add"
        assert isinstance(args["a"], int) and isinstance(args["b"], int)
    return call.function.name, args


def ask(client, kwargs, name, **kw):
    kw.setdefault("max_tokens", MAX_TOKENS.get(name, 200))
    return client.chat.completions.create(
        model=MODEL_ID, messages=kw.pop("messages", MESSAGES), tools=TOOLS, temperature=0,
        extra_body={"chat_template_kwargs": kwargs} if kwargs else None, **kw)


def test_required_call_whole_and_streamed(fmt):
    name, client, kwargs, server = fmt
    parser = "glm45" if name == "glm47" else name
    assert "tool calls: " + parser + ";" in "".join(server.log), server.log
    r = ask(client, kwargs, name, tool_choice="required", parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c, server.log[-5:])
    assert len(c.message.tool_calls) == 1
    whole = check_call(c.message.tool_calls[0])
    assert not c.message.content
    # Streamed: the call arrives as deltas in OpenAI's shape; greedy, so the same call.
    calls, finish = {}, None
    for ch in ask(client, kwargs, name, tool_choice="required", parallel_tool_calls=False, stream=True):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            acc = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            acc["name"] += tc.function.name or ""
            acc["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert len(calls) == 1
    assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == whole


def test_named_function(fmt):
    name, client, kwargs, _ = fmt
    r = ask(client, kwargs, name, tool_choice={"type": "function", "function": {"name": "add"}},
            parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    check_call(r.choices[0].message.tool_calls[0], only="add")


def test_call_and_result_round_trip(fmt):
    name, client, kwargs, _ = fmt
    r = ask(client, kwargs, name, tool_choice="required", parallel_tool_calls=False)
    call = r.choices[0].message.tool_calls[0]
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    if name == "kimi_k2":
        # This template appends to a list while rendering tool calls, which
        # transformers' sandbox refuses too: a clear 400, not a crash.
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, kwargs, name, messages=history, max_tokens=24)
        assert "append" in e.value.body["message"]
        return
    r2 = ask(client, kwargs, name, messages=history, max_tokens=24)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens


# Structured output on the default model and template.

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"enum": ["Paris", "Oslo", "Rome"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
    "required": ["name", "age", "city"], "additionalProperties": False}


@pytest.fixture(scope="module")
def default_client():
    with Server() as s:
        yield openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)


def fits(obj):
    assert set(obj) <= set(SCHEMA["properties"]) and {"name", "age", "city"} <= set(obj)
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 24
    assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 120
    assert obj["city"] in ("Paris", "Oslo", "Rome")
    assert len(obj.get("tags", [])) <= 3


def test_json_schema_whole_streamed_and_n(default_client):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    r = default_client.chat.completions.create(model=MODEL_ID, messages=msgs, response_format=rf,
                                               max_tokens=120, temperature=0.9, seed=1, n=3)
    for c in r.choices:
        assert c.finish_reason == "stop", c
        fits(json.loads(c.message.content))
    text = ""
    for ch in default_client.chat.completions.create(model=MODEL_ID, messages=msgs, response_format=rf,
                                                     max_tokens=120, temperature=0, stream=True):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
    fits(json.loads(text))


def test_json_object_regex_and_choice(default_client):
    r = default_client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "A JSON object about cats."}],
        response_format={"type": "json_object"}, max_tokens=200, temperature=0)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")
    r = default_client.completions.create(model=MODEL_ID, prompt="Call me at", max_tokens=20,
                                          extra_body={"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})
    import re
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", r.choices[0].text), r.choices[0].text
    r = default_client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["Paris", "London", "Berlin"]}})
    assert r.choices[0].text in ("Paris", "London", "Berlin")
    # Logprobs under a constraint: alternatives it ruled out are not listed.
    r = default_client.completions.create(model=MODEL_ID, prompt="The capital of France is",
                                          max_tokens=10, logprobs=5,
                                          extra_body={"guided_choice": ["Paris", "Rome"]})
    for top in r.choices[0].logprobs.top_logprobs:
        assert all(isinstance(v, float) for v in top.values()), top


def test_schema_errors_name_the_field(default_client):
    with pytest.raises(openai.BadRequestError) as e:
        default_client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "x"}], max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"x": {"type": "string", "format": "hostname"}}}}})
    assert e.value.body["param"] == "response_format"
    assert "format" in e.value.body["message"]
