"""The official `openai` Python client against a real `kvant serve`:
chat and completions, streamed and not, usage, stop sequences, seeded
determinism, logprobs, /v1/models, the API key. Every test runs twice: on
one server, and through `kvant router` in front of a prefill and a decode
server (a client cannot tell them apart); the multi-token-prediction test
starts servers of its own."""
import json
import math
import os

import openai
import pytest

from kvant_server import MODEL_ID, Server, Stack, model_path

API_KEY = "test-key-123"


@pytest.fixture(scope="module", params=["server", "router"])
def server(request):
    if request.param == "server":
        with Server("--api-key", API_KEY) as s:
            yield s
    else:
        with Stack(common=["--api-key", API_KEY]) as s:
            yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL_ID]


def test_chat(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=24,
                                       temperature=0)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == MODEL_ID
    assert r.created > 0
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert "Paris" in c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_length(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES,
                                       max_completion_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_chat_stream_matches_plain(client):
    plain = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=24,
                                           temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=MESSAGES,
                                                 max_tokens=24, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and
                c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1


def test_stream_without_usage(client):
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=4,
                                                 stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_completions(client):
    r = client.completions.create(model=MODEL_ID, prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert len(r.choices[0].text) > 0
    assert r.usage.completion_tokens <= 8
    s = list(client.completions.create(model=MODEL_ID, prompt="The capital of France is",
                                       max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


def test_completions_token_prompt(client):
    r = client.completions.create(model=MODEL_ID, prompt=[504, 3575, 282], max_tokens=4,
                                  temperature=0)
    assert r.usage.prompt_tokens == 3


def test_stop_sequences(client):
    base = client.completions.create(model=MODEL_ID, prompt="Count: 1, 2, 3, 4,", max_tokens=16,
                                     temperature=0).choices[0].text
    assert len(base) > 4
    stop = base[2:4]
    r = client.completions.create(model=MODEL_ID, prompt="Count: 1, 2, 3, 4,", max_tokens=16,
                                  temperature=0, stop=stop)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[:base.index(stop)]
    r2 = client.completions.create(model=MODEL_ID, prompt="Count: 1, 2, 3, 4,", max_tokens=16,
                                   temperature=0, stop=["zzzz", stop])
    assert r2.choices[0].text == r.choices[0].text
    # Streamed, the stop string never shows either.
    s = list(client.completions.create(model=MODEL_ID, prompt="Count: 1, 2, 3, 4,",
                                       max_tokens=16, temperature=0, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


def test_seeded_determinism(client):
    kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a story."}],
              max_tokens=32, temperature=1.0, top_p=0.95,
              extra_body={"top_k": 50, "min_p": 0.01})
    a = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    s = list(client.chat.completions.create(seed=1234, stream=True, **kw))
    c = "".join(x.choices[0].delta.content or "" for x in s if x.choices)
    assert a == b == c
    others = {client.chat.completions.create(seed=seed, **kw).choices[0].message.content
              for seed in (1, 2, 3)}
    assert len(others | {a}) > 1


def test_several_choices(server, client):
    kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a story."}],
              max_tokens=12, temperature=1.0, seed=99)
    r = client.chat.completions.create(n=4, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1  # independent sampling
    # Choice 0 is the request's own seed; the whole answer repeats.
    assert texts[0] == client.chat.completions.create(**kw).choices[0].message.content
    assert texts == [c.message.content for c in client.chat.completions.create(n=4, **kw).choices]
    assert 4 <= r.usage.completion_tokens <= 4 * 12  # every choice's tokens
    # Streamed: deltas carry their choice's index, each choice ends once,
    # the text per choice equals the whole answer's.
    chunks = list(client.chat.completions.create(n=4, stream=True,
                                                 stream_options={"include_usage": True}, **kw))
    streamed = ["", "", "", ""]
    finishes = [[], [], [], []]
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index].append(ch.finish_reason)
    assert streamed == texts
    assert all(len(f) == 1 for f in finishes)
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # The other choices reuse the first one's prompt pages (one server: the
    # prefix cache's hit counter grows by about 3 prompts of 4 choices).
    if isinstance(server, Server):
        long_kw = dict(kw, messages=[{"role": "user", "content": "Tell me a story about " +
                                      "a lighthouse keeper and a storm at sea, " * 12}])
        before = server.metrics()["kvant_prefix_cache_hit_tokens_total"]
        lr = client.chat.completions.create(n=4, **long_kw)
        hits = server.metrics()["kvant_prefix_cache_hit_tokens_total"] - before
        assert hits >= 3 * (lr.usage.prompt_tokens - 16)
    # Greedy: every choice is the same answer.
    g = client.completions.create(model=MODEL_ID, prompt="The capital of France is",
                                  max_tokens=6, temperature=0, n=3)
    assert len({c.text for c in g.choices}) == 1 and len(g.choices) == 3


def test_penalties_and_user(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=16,
                                       temperature=0, presence_penalty=1.5,
                                       frequency_penalty=1.0, user="someone", n=1)
    assert r.choices[0].message.content


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    text = "".join(t.token for t in content)
    assert r.choices[0].message.content.startswith(text.rstrip()[:5])
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(t.logprob, t.top_logprobs[0].logprob, abs_tol=1e-5)
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert bytes(t.bytes) == t.token.encode()
    s = list(client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=8,
                                            temperature=0, logprobs=True, top_logprobs=3,
                                            stream=True))
    streamed = [t for c in s if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(math.isclose(a.logprob, b.logprob, abs_tol=1e-6)
               for a, b in zip(streamed, content))


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL_ID, prompt="The capital of France is",
                                  max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0
    assert all(len(t) == 2 for t in lp.top_logprobs)


def test_wrong_key(server):
    bad = openai.OpenAI(base_url=server.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_bad_request_is_reported(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, temperature=5)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)


def test_logit_bias(client):
    # +100 on one token: greedy decoding picks it at every step (the first
    # token too, which through the router is the prefill server's).
    r = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=4,
                                  temperature=0, logit_bias={"1000": 100}, logprobs=0,
                                  extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
    assert r.choices[0].logprobs.tokens == ["token_id:1000"] * 4, r.choices[0].logprobs.tokens
    # -100 on the greedy first token: another one comes first.
    plain = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=1,
                                      temperature=0, logprobs=0,
                                      extra_body={"return_tokens_as_token_ids": True})
    first = plain.choices[0].logprobs.tokens[0].split(":")[1]
    banned = client.completions.create(model=MODEL_ID, prompt="The capital of France is",
                                       max_tokens=1, temperature=0, logit_bias={first: -100},
                                       logprobs=0, extra_body={"return_tokens_as_token_ids": True})
    assert banned.choices[0].logprobs.tokens[0] != f"token_id:{first}"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_ID, prompt="hi", max_tokens=1,
                                  logit_bias={"99999999": 1})
    assert "vocabulary" in str(e.value)


COPY = ("Repeat the following list exactly, one item per line:\n"
        "apples, pears, plums, cherries, grapes, lemons, limes, oranges, peaches, melons, "
        "figs, dates, kiwis, mangoes, papayas, guavas")


def test_speculative_decoding_changes_nothing_but_speed(server, client):
    # Prompt lookup drafts, verified as the engine's own decodes: the same
    # text, greedy and seeded, whole and streamed, on one server and behind
    # the router (the decode server drafts there).
    for extra in ({}, {"temperature": 0.8, "seed": 7}):
        kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": COPY}], max_tokens=64,
                  **({"temperature": 0} | extra))
        plain = client.chat.completions.create(**kw).choices[0].message.content
        spec = client.chat.completions.create(
            extra_body={"speculative": {"method": "ngram", "num_speculative_tokens": 6}},
            **kw).choices[0].message.content
        s = list(client.chat.completions.create(extra_body={"speculative": True}, stream=True,
                                                **kw))
        streamed = "".join(x.choices[0].delta.content or "" for x in s if x.choices)
        assert plain == spec == streamed
    if isinstance(server, Server):
        assert server.metrics()["kvant_spec_decode_accepted_tokens_total"] > 0
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=4,
                                       extra_body={"speculative": {"method": "eagle"}})
    assert "speculative.method" in str(e.value)


MTP_MODEL = os.path.join(os.path.dirname(__file__), "..", "fixtures", "mtp", "glm4_moe_trained")


def test_mtp_drafts_over_http():
    # A GLM-4.5-shaped fixture with a trained multi-token-prediction layer
    # (tools/fixtures/gen_mtp.py), the SmolLM2 tokenizer for text, prompts as
    # token ids: the same tokens with method mtp as without, most drafts
    # accepted; a server without --mtp refuses method mtp by name.
    with open(os.path.join(MTP_MODEL, "ids.json")) as f:
        prompts = json.load(f)["prompts"]
    common = ("--tokenizer", model_path())
    with Server(*common, "--mtp", model=MTP_MODEL, kv_memory="16MiB") as s:
        for p in prompts:
            body = {"model": "glm4_moe_trained", "prompt": p, "max_tokens": 40, "temperature": 0,
                    "ignore_eos": True, "logprobs": 1}
            st, _, plain = s.request("POST", "/v1/completions", body)
            assert st == 200, plain
            st, _, spec = s.request("POST", "/v1/completions",
                                    body | {"speculative": {"method": "mtp"}})
            assert st == 200, spec
            a, b = json.loads(plain)["choices"][0], json.loads(spec)["choices"][0]
            assert a["text"] == b["text"]
            assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
        m = s.metrics()
        assert m["kvant_spec_decode_accepted_tokens_total"] > 0.5 * m["kvant_spec_decode_draft_tokens_total"]
    with Server(*common, model=MTP_MODEL, kv_memory="16MiB") as s:
        st, _, body = s.request("POST", "/v1/completions",
                                {"model": "glm4_moe_trained", "prompt": prompts[0], "max_tokens": 4,
                                 "speculative": {"method": "mtp"}})
        assert st == 400 and b"--mtp" in body, body
