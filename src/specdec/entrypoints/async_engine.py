"""`AsyncEngine`: one decoder's engine loop in a background thread, fed by coroutines.

Owns the hand-over between asyncio code (a server, `SpecDecoder.astream`) and the engine,
which is not thread-safe and must only be touched by one thread: coroutines check a request
(no engine state is read) and put a command in a queue; the engine thread admits it, runs
`run_iteration` while there is work, and sends each request's `StreamDelta`s back to the
coroutine's event loop (`call_soon_threadsafe`). A coroutine that stops listening (a client
that disconnected) aborts its request, and the engine frees its slot at once. The thread
also runs `warmup()` before the first request, so CUDA graphs are captured and replayed on
the same thread.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..config import SamplingParams
from .streaming import IncrementalDetokenizer, StreamDelta

__all__ = ["AsyncEngine"]


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    index: int
    detok: IncrementalDetokenizer
    request: object = None  # the engine's RequestState, set by the engine thread
    sent: int = 0
    started: float = field(default_factory=time.perf_counter)


class AsyncEngine:
    """Serve a `SpecDecoder` to many coroutines at once (continuous batching across them).

    Args:
        decoder: the `SpecDecoder`; while this runs, nothing else may call its `generate`.
    """

    def __init__(self, decoder) -> None:
        self.decoder = decoder
        self.engine = decoder.engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
        self._stop = False
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.completed = 0  # requests finished (server metrics)
        self.tokens = 0  # tokens handed out

    def start(self) -> "AsyncEngine":
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the engine thread (after its current iteration); the decoder can make a new one."""
        self._stop = True
        self._commands.put(("wake", None))
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if getattr(self.decoder, "_async", None) is self:
            self.decoder._async = None

    # ------------------------------------------------------------------ coroutine side
    async def stream(self, prompt: list[int], params: SamplingParams, *, index: int = 0) -> AsyncIterator[StreamDelta]:
        """Run one request; yield its deltas. Checked first (`ConfigError` before any work)."""
        self.engine.check_request(prompt, params)
        async for delta in self.stream_checked(prompt, params, index=index):
            yield delta

    async def stream_checked(self, prompt: list[int], params: SamplingParams, *,
                             index: int = 0) -> AsyncIterator[StreamDelta]:
        """`stream` for a request its caller has checked already (`SpecEngine.check_request`:
        the decoder and the server check every request once, before any work)."""
        handle = next(self._ids)
        loop = asyncio.get_running_loop()
        st = _Stream(loop, asyncio.Queue(), index, IncrementalDetokenizer(self.decoder.target.tokenizer))
        self._streams[handle] = st
        self._commands.put(("submit", (handle, prompt, params)))
        finished = False
        try:
            while not finished:
                delta = await st.queue.get()
                finished = delta.finish_reason is not None
                yield delta
        finally:
            if not finished:  # the listener went away: free the slot now
                self._commands.put(("abort", handle))

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            if not self.engine.warmed and (self.decoder.compiled or self.decoder.cuda_graphs):
                self.decoder.warmup(progress=False)
        except BaseException as err:  # noqa: BLE001 - reported to every caller
            self.error = err
        self.ready.set()
        while not self._stop:
            block = not self.engine.has_work()
            self._drain(block)
            if self._stop or not self.engine.has_work():
                continue
            try:
                touched = self.engine.run_iteration()
            except BaseException as err:  # noqa: BLE001 - a host-side bug: fail everything, keep serving
                self.engine.abort_all("error", f"{type(err).__name__}: {err}")
                touched = [st.request for st in self._streams.values() if st.request is not None]
            self._dispatch(touched)

    def _drain(self, block: bool) -> None:
        while True:
            try:
                kind, arg = self._commands.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if kind == "submit":
                handle, prompt, params = arg
                st = self._streams[handle]
                if self.error is not None:
                    self._send(st, StreamDelta(st.index, [], None, "error", f"warmup failed: {self.error}"))
                    self._streams.pop(handle, None)
                    continue
                try:
                    st.request = self.engine.enqueue(prompt, params)  # checked by `stream` / the caller
                    st.request.tag = handle
                except Exception as err:  # noqa: BLE001 - reported to this stream, the others go on
                    self._send(st, StreamDelta(st.index, [], None, "error", f"{type(err).__name__}: {err}"))
                    self._streams.pop(handle, None)
            elif kind == "abort":
                st = self._streams.pop(arg, None)
                if st is not None and st.request is not None:
                    self.engine.abort(st.request)

    def _dispatch(self, touched) -> None:
        for request in touched:
            handle = request.tag
            st = self._streams.get(handle)
            if st is None:
                continue
            new = request.token_ids[st.sent:]
            st.sent = len(request.token_ids)
            self.tokens += len(new)
            if not new and not request.finished:
                continue
            text = st.detok.push(new, final=request.finished)
            reason = request.finish_reason if request.finished else None
            stats = self.decoder._stats(request, time.perf_counter() - st.started) if request.finished else None
            self._send(st, StreamDelta(st.index, new, text, reason, request.error, stats))
            if request.finished:
                self.completed += 1
                self._streams.pop(handle, None)

    @staticmethod
    def _send(st: _Stream, delta: StreamDelta) -> None:
        st.loop.call_soon_threadsafe(st.queue.put_nowait, delta)
