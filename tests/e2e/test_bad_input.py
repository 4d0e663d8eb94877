"""Bad requests over raw HTTP: each gets an OpenAI-style error object with
the expected status, and the server keeps serving afterwards."""
import json

import pytest

from kvant_server import MODEL_ID, Server

KEY = "k3y"
AUTH = {"Authorization": "Bearer " + KEY}
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return {"model": MODEL_ID, "messages": MSGS, "max_tokens": 2, **kw}


def comp(**kw):
    return {"model": MODEL_ID, "prompt": "hi", "max_tokens": 2, **kw}


LONG_PROMPT = "hello " * 700  # well past the 512-token context the server gets

# (name, method, path, body, headers, expected status, param or None)
CASES = [
    ("malformed json", "POST", CHAT, '{"model": "x", ', AUTH, 400, None),
    ("json array body", "POST", CHAT, "[1, 2]", AUTH, 400, None),
    ("json string body", "POST", COMP, '"hello"', AUTH, 400, None),
    ("empty body", "POST", CHAT, "", AUTH, 400, None),
    ("missing model", "POST", CHAT, {"messages": MSGS}, AUTH, 400, "model"),
    ("model not a string", "POST", CHAT, {"model": 3, "messages": MSGS}, AUTH, 400, "model"),
    ("unknown model", "POST", CHAT, {"model": "gpt-4", "messages": MSGS}, AUTH, 404, "model"),
    ("missing messages", "POST", CHAT, {"model": MODEL_ID}, AUTH, 400, "messages"),
    ("messages not a list", "POST", CHAT, chat(messages="hi"), AUTH, 400, "messages"),
    ("empty messages", "POST", CHAT, chat(messages=[]), AUTH, 400, "messages"),
    ("message not an object", "POST", CHAT, chat(messages=["hi"]), AUTH, 400, "messages[0]"),
    ("message without role", "POST", CHAT, chat(messages=[{"content": "hi"}]), AUTH, 400,
     "messages[0].role"),
    ("unknown role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), AUTH,
     400, "messages[0].role"),
    ("content wrong type", "POST", CHAT, chat(messages=[{"role": "user", "content": 5}]), AUTH,
     400, "messages[0].content"),
    ("image content part", "POST", CHAT,
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), AUTH,
     400, "messages[0].content"),
    ("missing prompt", "POST", COMP, {"model": MODEL_ID}, AUTH, 400, "prompt"),
    ("prompt wrong type", "POST", COMP, comp(prompt={"a": 1}), AUTH, 400, "prompt"),
    ("empty prompt", "POST", COMP, comp(prompt=""), AUTH, 400, "prompt"),
    ("several prompts", "POST", COMP, comp(prompt=["a", "b"]), AUTH, 400, "prompt"),
    ("token id out of vocab", "POST", COMP, comp(prompt=[1, 99999999]), AUTH, 400, "prompt"),
    ("negative token id", "POST", COMP, comp(prompt=[1, -4]), AUTH, 400, "prompt"),
    ("prompt longer than context", "POST", COMP, comp(prompt=LONG_PROMPT), AUTH, 400, "prompt"),
    ("chat longer than context", "POST", CHAT,
     chat(messages=[{"role": "user", "content": LONG_PROMPT}]), AUTH, 400, "messages"),
    ("max_tokens zero", "POST", CHAT, chat(max_tokens=0), AUTH, 400, "max_tokens"),
    ("max_tokens string", "POST", CHAT, chat(max_tokens="10"), AUTH, 400, "max_tokens"),
    ("max_tokens float", "POST", COMP, comp(max_tokens=2.5), AUTH, 400, "max_tokens"),
    ("max_completion_tokens negative", "POST", CHAT, chat(max_completion_tokens=-1), AUTH, 400,
     "max_completion_tokens"),
    ("temperature too high", "POST", CHAT, chat(temperature=2.5), AUTH, 400, "temperature"),
    ("temperature negative", "POST", COMP, comp(temperature=-0.1), AUTH, 400, "temperature"),
    ("temperature string", "POST", CHAT, chat(temperature="hot"), AUTH, 400, "temperature"),
    ("top_p zero", "POST", CHAT, chat(top_p=0), AUTH, 400, "top_p"),
    ("top_p above one", "POST", COMP, comp(top_p=1.5), AUTH, 400, "top_p"),
    ("top_k below -1", "POST", CHAT, chat(top_k=-5), AUTH, 400, "top_k"),
    ("min_p above one", "POST", CHAT, chat(min_p=2), AUTH, 400, "min_p"),
    ("presence_penalty out of range", "POST", CHAT, chat(presence_penalty=3), AUTH, 400,
     "presence_penalty"),
    ("frequency_penalty out of range", "POST", COMP, comp(frequency_penalty=-2.5), AUTH, 400,
     "frequency_penalty"),
    ("seed not an integer", "POST", CHAT, chat(seed="abc"), AUTH, 400, "seed"),
    ("n = 0", "POST", CHAT, chat(n=0), AUTH, 400, "n"),
    ("n above the limit", "POST", CHAT, chat(n=65), AUTH, 400, "n"),
    ("best_of other than n", "POST", COMP, comp(n=2, best_of=4), AUTH, 400, "best_of"),
    ("echo with n > 1", "POST", COMP, comp(n=2, echo=True), AUTH, 400, "echo"),
    ("a message field not read", "POST", CHAT,
     chat(messages=[{"role": "user", "content": "hi", "audio": {"id": "a1"}}]), AUTH, 400,
     "messages[0].audio"),
    ("tool_call_id on a user message", "POST", CHAT,
     chat(messages=[{"role": "user", "content": "hi", "tool_call_id": "c1"}]), AUTH, 400,
     "messages[0].tool_call_id"),
    ("a stream option not read", "POST", CHAT,
     chat(stream=True, stream_options={"continuous_usage_stats": True}), AUTH, 400,
     "stream_options.continuous_usage_stats"),
    ("stop wrong type", "POST", CHAT, chat(stop=5), AUTH, 400, "stop"),
    ("stop list with a number", "POST", COMP, comp(stop=["a", 3]), AUTH, 400, "stop"),
    ("empty stop string", "POST", COMP, comp(stop=[""]), AUTH, 400, "stop"),
    ("too many stop strings", "POST", COMP, comp(stop=[str(i) for i in range(17)]), AUTH, 400,
     "stop"),
    ("stream not a bool", "POST", CHAT, chat(stream="yes"), AUTH, 400, "stream"),
    ("stream_options without stream", "POST", CHAT, chat(stream_options={"include_usage": True}),
     AUTH, 400, "stream_options"),
    ("include_usage not a bool", "POST", CHAT,
     chat(stream=True, stream_options={"include_usage": 1}), AUTH, 400,
     "stream_options.include_usage"),
    ("top_logprobs without logprobs", "POST", CHAT, chat(top_logprobs=2), AUTH, 400,
     "top_logprobs"),
    ("top_logprobs too many", "POST", CHAT, chat(logprobs=True, top_logprobs=21), AUTH, 400,
     "top_logprobs"),
    ("completion logprobs too many", "POST", COMP, comp(logprobs=21), AUTH, 400, "logprobs"),
    ("logprobs not a bool", "POST", CHAT, chat(logprobs="yes"), AUTH, 400, "logprobs"),
    ("user not a string", "POST", CHAT, chat(user=42), AUTH, 400, "user"),
    ("max_tokens 0 without echo", "POST", COMP, comp(max_tokens=0), AUTH, 400, "max_tokens"),
    ("tools for a model whose template has none", "POST", CHAT,
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), AUTH, 400,
     "tools"),
    ("tool_choice required without tools", "POST", CHAT, chat(tool_choice="required"), AUTH, 400,
     "tool_choice"),
    ("response_format schema with an unsupported keyword", "POST", CHAT,
     chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {
         "type": "object", "properties": {"x": {"type": "number", "multipleOf": 3}}}}}),
     AUTH, 400, "response_format"),
    ("response_format schema not an object", "POST", CHAT,
     chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": 5}}),
     AUTH, 400, "response_format.json_schema.schema"),
    ("response_format unknown type", "POST", CHAT, chat(response_format={"type": "yaml"}), AUTH,
     400, "response_format.type"),
    ("guided_regex with a look-ahead", "POST", COMP, comp(guided_regex="(?=a)b"), AUTH, 400,
     "guided_regex"),
    ("guided_choice empty", "POST", COMP, comp(guided_choice=[]), AUTH, 400, "guided_choice"),
    ("schema with a remote $ref", "POST", COMP,
     comp(structured_outputs={"json": {"$ref": "http://example.com/s.json"}}), AUTH, 400,
     "structured_outputs.json"),
    ("tool call arguments not JSON", "POST", CHAT,
     chat(messages=[{"role": "assistant", "tool_calls": [{"type": "function", "function": {
         "name": "f", "arguments": "{oops"}}]}]), AUTH, 400,
     "messages[0].tool_calls[0].function.arguments"),
    ("logit_bias key not a token id", "POST", COMP, comp(logit_bias={"hello": 5}), AUTH, 400,
     "logit_bias"),
    ("logit_bias value out of range", "POST", COMP, comp(logit_bias={"50": 500}), AUTH, 400,
     "logit_bias"),
    ("logit_bias token outside the vocabulary", "POST", COMP, comp(logit_bias={"99999999": 5}),
     AUTH, 400, None),
    ("unknown field", "POST", COMP, comp(frobnicate=1), AUTH, 400, "frobnicate"),
    ("completions field on chat", "POST", CHAT, chat(echo=True), AUTH, 400, "echo"),
    ("temperature overflows a double", "POST", CHAT,
     '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}'
     % MODEL_ID, AUTH, 400, None),
    ("seed overflows a double", "POST", COMP,
     '{"model": "%s", "prompt": "hi", "seed": 1e400}' % MODEL_ID, AUTH, 400, None),
    ("invalid utf-8", "POST", CHAT,
     b'{"model": "' + MODEL_ID.encode() + b'", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
     AUTH, 400, None),
    ("missing api key", "POST", CHAT, chat(), {}, 401, None),
    ("wrong api key", "POST", CHAT, chat(), {"Authorization": "Bearer nope"}, 401, None),
    ("models without key", "GET", "/v1/models", None, {}, 401, None),
    ("GET on chat", "GET", CHAT, None, AUTH, 405, None),
    ("DELETE on completions", "DELETE", COMP, None, AUTH, 405, None),
    ("POST on models", "POST", "/v1/models", "{}", AUTH, 405, None),
    ("POST on health", "POST", "/health", "{}", {}, 405, None),
    ("unknown path", "GET", "/v1/embeddings", None, AUTH, 404, None),
    ("unknown model path", "GET", "/v1/models/other", None, AUTH, 404, None),
    ("oversize body", "POST", CHAT,
     json.dumps(chat(messages=[{"role": "user", "content": "x" * 70000}])), AUTH, 413, None),
]


@pytest.fixture(scope="module")
def server():
    with Server("--api-key", KEY, "--max-body", "64KiB", "-c", "512") as s:
        yield s


def check_serves(server):
    status, _, body = server.request("POST", COMP, comp(temperature=0), AUTH)
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"]


def test_case_count():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(server, case):
    name, method, path, body, headers, want, param = case
    status, hdrs, raw = server.request(method, path, body, headers)
    assert status == want, raw
    assert hdrs["content-type"] == "application/json"
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if want == 401:
        assert err["type"] == "authentication_error"
    if want == 405:
        assert "allow" in hdrs
    if "longer than context" in name:
        # Both token counts are named.
        assert "512" in err["message"] and "the prompt has" in err["message"], err
        assert err["code"] == "context_length_exceeded"
    if name == "invalid utf-8":
        assert "UTF-8" in err["message"]
    # The server is still up and serving others.
    check_serves(server)


def test_malformed_http(server):
    status, _, raw = server.request(None, None, raw=b"THIS IS NOT HTTP\r\n\r\n")
    assert status == 400
    status, _, raw = server.request(
        None, None, raw=b"POST /v1/completions HTTP/1.1\r\nContent-Length: zz\r\n\r\n")
    assert status == 400
    check_serves(server)


def test_serves_after_everything(server):
    check_serves(server)
    status, _, body = server.request("GET", "/health")
    assert status == 200
    m = server.metrics()
    assert m['kvant_http_responses_total{code="400"}'] >= 40


def test_api_key_is_checked_before_the_body(server):
    """A client without the key announces a body (within the size limit) and
    sends none of it: the answer (401) comes from the headers alone, at once,
    not after the body timeout."""
    import socket
    import time

    from kvant_server import parse_response

    head = (f"POST {COMP} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {32 << 10}\r\n\r\n").encode()
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    took = time.time() - t0
    status, hdrs, body = parse_response(data)
    assert status == 401, data[:300]
    assert json.loads(body)["error"]["type"] == "authentication_error"
    assert took < 2, f"the 401 took {took:.2f} s"
    check_serves(server)
