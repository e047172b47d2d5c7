"""`specdec serve`: an OpenAI-compatible HTTP server over one `SpecDecoder`.

Owns the HTTP surface (FastAPI): `/v1/completions`, `/v1/chat/completions` (the target's chat
template), both streamed as server-sent events or not, `/v1/models`, `/health` and
`/metrics` (Prometheus text). Every request becomes one engine request through the decoder's
`AsyncEngine`, so concurrent clients are batched together by the engine's continuous
batching. Request fields map to `SamplingParams` (`max_tokens`, `temperature`, `top_p`,
`seed`, `stop`, plus the extensions `top_k`, `min_p`, `ignore_eos`, `num_draft_tokens`); a
bad field is a 400 naming the field and the allowed range and never touches other requests;
an overlong prompt is a 400 naming the limit; a `model` other than the one served is a 404
naming the served one; a client that disconnects frees its slot. Stop strings are matched on
the streamed text (the text is cut before the match). Every request is one access-log line on
the `specdec.entrypoints.server` logger (method, path, status, prompt and completion tokens, seconds,
mean acceptance).

(No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations.)
"""

import json
import logging
import time
import uuid
from contextlib import aclosing, asynccontextmanager

from ..config import ConfigError, SamplingParams

__all__ = ["build_app", "sampling_from_body", "RequestError", "StopMatcher"]

log = logging.getLogger("specdec.entrypoints.server")

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos", "num_draft_tokens")
_UNSUPPORTED = dict(n=1, best_of=1, echo=False, logprobs=None, presence_penalty=0, frequency_penalty=0, suffix=None)


class RequestError(ValueError):
    """A client's mistake: the HTTP status, the offending field, the message."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def sampling_from_body(body: dict, vocab_size: int) -> tuple[SamplingParams, list[str]]:
    """`SamplingParams` and stop strings from an OpenAI request body; `RequestError` names the field."""
    for name, default in _UNSUPPORTED.items():
        if body.get(name, default) not in (default, None):
            raise RequestError(f"{name}={body[name]!r} is not supported by specdec; allowed: {default!r}", name)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
    kw = {k: body[k] for k in _SAMPLING_FIELDS if body.get(k) is not None}
    kw.setdefault("temperature", 1.0)  # OpenAI's default
    stop = body.get("stop")
    stops: list[str] = []
    stop_ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    elif isinstance(stop, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        stop_ids = tuple(stop)
    elif stop is not None:
        raise RequestError(f"stop={stop!r} must be a string, a list of strings or a list of token ids", "stop")
    if "stop_token_ids" in body:
        stop_ids += tuple(body["stop_token_ids"] or ())
    try:
        params = SamplingParams(max_new_tokens=max_tokens, stop_token_ids=stop_ids, **kw)
    except (ConfigError, TypeError) as err:
        message = str(err)
        field = next((f for f in ("max_new_tokens",) + _SAMPLING_FIELDS + ("stop_token_ids",) if message.startswith(f)), None)
        if field == "max_new_tokens":
            field, message = "max_tokens", message.replace("max_new_tokens", "max_tokens", 1)
        raise RequestError(message, field) from err
    if params.top_k > vocab_size:
        raise RequestError(f"top_k={params.top_k} is out of range; allowed: [0, {vocab_size}]", "top_k")
    return params, stops


class StopMatcher:
    """Stop strings over streamed text: what may be sent now, and where the text ends.

    A stop string can span pieces ("w64" then " w64" against the stop "w64 w64"), so the
    longest tail of the text that could still begin a stop string is held back until the
    next piece decides; text once sent is never taken back. `push(piece)` returns (the text
    that may be sent now, whether a stop string matched: then the text ended before it);
    `flush()` returns what is held back when generation ends without a match.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.text, self.sent = "", 0

    def push(self, piece: str) -> tuple[str, bool]:
        self.text += piece
        # a match starts in the unsent text: any tail that could begin one was held back
        hits = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if hits:
            out, self.sent = self.text[self.sent : min(hits)], len(self.text)
            return out, True
        keep = max((k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        end = max(self.sent, len(self.text) - keep)
        out, self.sent = self.text[self.sent : end], end
        return out, False

    def flush(self) -> str:
        out, self.sent = self.text[self.sent :], len(self.text)
        return out


def _finish_reason(reason: str | None) -> str | None:
    """Engine finish reasons -> OpenAI's ("stop" for stop/eos/aborted, "length")."""
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"


def build_app(decoder, *, model_name: str = "specdec"):
    """The FastAPI app serving `decoder` (its `AsyncEngine` starts with the app)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

    engine = decoder.async_engine()

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.stop()

    app = FastAPI(title="specdec", version="0.1.0", lifespan=lifespan)
    tokenizer = decoder.target.tokenizer
    vocab = decoder.target.info.vocab_size
    counters = dict(requests=0, rejected=0)

    def error(err: RequestError, request: Request, started: float) -> JSONResponse:
        counters["rejected"] += 1
        access(request, err.status, started)
        body = {"error": {"message": str(err), "type": "invalid_request_error", "param": err.param, "code": err.code}}
        return JSONResponse(body, status_code=err.status)

    def access(request: Request, status: int, started: float, prompt: int = 0, completion: int = 0, stats=None) -> None:
        """The request's access-log line: method, path, status, tokens, seconds, mean acceptance."""
        mean = getattr(stats, "mean_accept_length", None)
        accept = f"{mean:.2f}" if isinstance(mean, (int, float)) else "-"
        log.info("%s %s %d prompt_tokens=%d completion_tokens=%d seconds=%.3f mean_acceptance=%s",
                 request.method, request.url.path, status, prompt, completion, time.perf_counter() - started, accept)

    def encode_prompt(body: dict) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if tokenizer is None:
                raise RequestError("this target has no tokenizer; send prompt as a list of token ids", "prompt")
            return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise RequestError("prompt must be a string or a list of token ids (one prompt per request)", "prompt")

    def encode_chat(body: dict) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise RequestError(f"messages[{i}] must be an object with string role and content", "messages")
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise RequestError("this target has no chat template; use /v1/completions", "messages")
        text = tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    async def prepare(request: Request, chat: bool):
        try:
            body = await request.json()
        except json.JSONDecodeError as err:
            raise RequestError(f"the body is not JSON: {err}", None) from err
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object", None)
        model = body.get("model")
        if model is not None and model != model_name:
            raise RequestError(f"the model {model!r} does not exist; this server serves: {model_name!r}", "model",
                               status=404, code="model_not_found")
        ids = encode_chat(body) if chat else encode_prompt(body)
        params, stops = sampling_from_body(body, vocab)
        try:
            decoder.engine.check_request(ids, params)
        except ConfigError as err:
            raise RequestError(str(err), "messages" if chat else "prompt") from err
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(f"stream={stream!r} must be true or false", "stream")
        return ids, params, stops, stream

    async def run(ids, params, stops, record: dict):
        """Yield (text piece, finish reason or None, error) until the end; `record` collects the
        completion tokens and the request's stats (usage and the access log)."""
        matcher, done = StopMatcher(stops), False
        async with aclosing(engine.stream_checked(ids, params)) as deltas:  # checked by `prepare` (a 400 then)
            async for delta in deltas:
                piece = delta.text or ""
                record["completion"] += len(delta.token_ids)
                record["stats"] = getattr(delta, "stats", None) or record["stats"]
                if matcher.stops:
                    piece, hit = matcher.push(piece)
                    if hit:
                        yield piece, "stop", None
                        return  # closing the stream aborts the engine request
                    if delta.finish_reason is not None:
                        piece += matcher.flush()
                yield piece, _finish_reason(delta.finish_reason), delta.error
                done = delta.finish_reason is not None
        if not done:
            yield "", "stop", None

    async def handle(request: Request, chat: bool):
        counters["requests"] += 1
        started = time.perf_counter()
        try:
            ids, params, stops, stream = await prepare(request, chat)
        except RequestError as err:
            return error(err, request, started)
        record = dict(completion=0, stats=None)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def choice(text: str, reason: str | None, delta: bool) -> dict:
            if not chat:
                return {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
            key = "delta" if delta else "message"
            return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": reason}

        def envelope(choices: list[dict], chunk: bool, usage: dict | None = None) -> dict:
            obj = kind + (".chunk" if chunk and chat else "")
            out = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": choices}
            if usage is not None:
                out["usage"] = usage
            return out

        if stream:
            async def events():
                status = 200
                try:
                    async with aclosing(run(ids, params, stops, record)) as pieces:
                        async for piece, reason, err in pieces:
                            if err is not None:
                                status = 500
                                yield f"data: {json.dumps({'error': {'message': err, 'type': 'server_error'}})}\n\n"
                                break
                            yield f"data: {json.dumps(envelope([choice(piece, reason, True)], True))}\n\n"
                            if reason is not None:
                                break
                    yield "data: [DONE]\n\n"
                finally:  # also when the client went away mid-stream
                    access(request, status, started, len(ids), record["completion"], record["stats"])

            return StreamingResponse(events(), media_type="text/event-stream")

        pieces, reason, err = [], None, None
        async with aclosing(run(ids, params, stops, record)) as parts:
            async for piece, r, e in parts:
                pieces.append(piece)
                reason, err = r or reason, e or err
                if r is not None:
                    break
        if err is not None:
            access(request, 500, started, len(ids), record["completion"], record["stats"])
            return JSONResponse({"error": {"message": err, "type": "server_error", "param": None, "code": None}}, 500)
        count = record["completion"]
        access(request, 200, started, len(ids), count, record["stats"])
        usage = {"prompt_tokens": len(ids), "completion_tokens": count, "total_tokens": len(ids) + count}
        return JSONResponse(envelope([choice("".join(pieces), reason or "stop", False)], False, usage))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "specdec"}]}

    @app.get("/health")
    async def health():
        if engine.error is not None:
            return JSONResponse({"status": "error", "error": str(engine.error)}, status_code=503)
        return {"status": "ok" if engine.ready.is_set() else "warming up"}

    @app.get("/metrics")
    async def metrics():
        eng = decoder.engine
        lines = [
            f"specdec_http_requests_total {counters['requests']}",
            f"specdec_http_requests_rejected_total {counters['rejected']}",
            f"specdec_requests_completed_total {engine.completed}",
            f"specdec_tokens_generated_total {engine.tokens}",
            f"specdec_requests_running {len(eng.running())}",
            f"specdec_requests_waiting {len(eng.waiting)}",
            f"specdec_slots_free {len(eng.free_slots())}",
            f"specdec_kv_blocks_free {eng.runner.cache.num_free_blocks}",
            f"specdec_step_seconds {eng.last_step_seconds:.6f}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    return app
