"""A streaming load generator that measures what clients see: TTFT, inter-token gaps, failures."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

PROMPTS = (
    "the engine worker profile step",
    "hello world the model server",
    "a request to the kernel queue and the cache",
    "decode prefill latency of the first token",
)


@dataclass
class RequestResult:
    ok: bool
    tokens: int = 0
    ttft_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # time.time() of each chunk
    error: str | None = None


@dataclass
class LoadResult:
    results: list[RequestResult]
    wall_s: float

    @property
    def failures(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.results)

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    def gaps(self) -> list[float]:
        return [g for r in self.results for g in r.gaps_s]

    def mean_itl_ms(self) -> float:
        gaps = self.gaps()
        return statistics.fmean(gaps) * 1e3 if gaps else 0.0

    def max_gap_ms(self, start: float | None = None, end: float | None = None) -> float:
        """Largest inter-token gap whose later token arrived within [start, end] (wall clock)."""
        worst = 0.0
        for r in self.results:
            for t, gap in zip(r.arrivals[1:], r.gaps_s):
                if (start is None or t >= start) and (end is None or t <= end):
                    worst = max(worst, gap)
        return worst * 1e3


async def stream_one(session: aiohttp.ClientSession, url: str, model: str, prompt: str,
                     max_tokens: int, headers: dict | None = None) -> RequestResult:
    # include_usage: the server's own token count arrives in a last chunk. Counting chunks is not
    # enough: a token whose text is empty (part of a UTF-8 character) shares the next token's chunk.
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "temperature": 0.0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    usage_tokens = None
    start = time.perf_counter()
    last = None
    result = RequestResult(ok=False)
    try:
        async with session.post(f"{url}/v1/completions", json=body, headers=headers or {}) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    result.ok = True
                    break
                chunk = json.loads(payload)
                usage = chunk.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    usage_tokens = usage["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                now = time.perf_counter()
                result.arrivals.append(time.time())
                if last is None:
                    result.ttft_s = now - start
                else:
                    result.gaps_s.append(now - last)
                last = now
                result.tokens += 1
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    if usage_tokens is not None:
        result.tokens = usage_tokens
    if result.ok is False and result.error is None:
        result.error = "stream ended without [DONE]"
    return result


async def run_load(url: str, model: str, *, concurrency: int = 8, requests: int | None = None,
                   duration_s: float | None = None, max_tokens: int = 64, stop=None,
                   stagger_s: float = 0.0) -> LoadResult:
    """``concurrency`` clients, each streaming requests back to back until ``requests`` in total
    were sent or ``duration_s`` passed (whichever is given; both bound the run), or ``stop`` (a
    threading.Event) is set. ``stagger_s``: client ``n`` starts ``n * stagger_s`` seconds after the
    first. Clients started together stay in step (every request is as long), so all of them send
    their next prompt in the same engine step, one long prefill step per request length; staggered,
    the prompts are spread over the steps as in steady serving."""
    if requests is None and duration_s is None:
        raise ValueError("give requests or duration_s")
    results: list[RequestResult] = []
    sent = 0
    deadline = time.monotonic() + duration_s if duration_s else None
    timeout = aiohttp.ClientTimeout(total=300)

    async def client(n: int, session: aiohttp.ClientSession) -> None:
        nonlocal sent
        if stagger_s > 0 and n:
            await asyncio.sleep(n * stagger_s)
        i = 0
        while ((requests is None or sent < requests) and (deadline is None or time.monotonic() < deadline)
               and not (stop is not None and stop.is_set())):
            sent += 1
            results.append(await stream_one(session, url, model, PROMPTS[(n + i) % len(PROMPTS)], max_tokens))
            i += 1

    start = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(n, session) for n in range(concurrency)))
    return LoadResult(results, time.perf_counter() - start)
