"""Completions of token-id prompts against a test stack's vLLM server, for the e2e tests that drive the
slow-token fixture model (a prompt ending in a trigger id; text prompts can never contain one)."""

from __future__ import annotations

import json
import time
import urllib.request


def complete(stack, prompt: list[int], max_tokens: int = 8, **extra) -> tuple[float, dict]:
    """One non-streaming completion of a token-id prompt: (seconds, response body). Long enough a
    timeout for the fixture's 30 s hang."""
    body = {"model": stack.served_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True, **extra}
    req = urllib.request.Request(f"{stack.server_url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        out = json.loads(resp.read())
    return time.perf_counter() - start, out
