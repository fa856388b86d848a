"""A continuous-batching text server over a Hugging Face causal LM, instrumented with ``sidecar.instrument``.

    python examples/continuous_batching_server.py --model models/tiny --port 8000 [--plant-sync]
    curl -N localhost:8000/generate -d '{"prompt": "the model", "max_tokens": 16}'

One process: HTTP handlers on the asyncio loop, the scheduler and the model on one engine thread. At
every step, waiting requests join the batch and finished ones leave it. The batch is left-padded and
recomputed in full each step (no KV cache: short, not fast). The sidecar (``sidecar serve``) sees one
step-driven process, ``scheduler``: captures, sync scans, the flight recorder, request spans, metrics.
"""

import argparse
import asyncio
import itertools
import queue
import threading

import torch
from aiohttp import web
from transformers import AutoModelForCausalLM, AutoTokenizer

import sidecar

PROFILE = sidecar.EngineProfile(
    name="example-cb", roles=(sidecar.SCHEDULER,), service_name="example-cb",
    phase_rules=(sidecar.PhaseRule(sidecar.SAMPLING, functions=frozenset({"sample"})),
                 sidecar.PhaseRule(sidecar.FORWARD, "/transformers/"),
                 sidecar.PhaseRule(sidecar.FORWARD, functions=frozenset({"forward"}))),
    allow_entries=(sidecar.AllowEntry("continuous_batching_server.py", "sample", "tolist",
                                      reason="the sampled token ids go to the host once a step"),))


class Request:
    def __init__(self, rid, prompt_ids, max_tokens, loop):
        self.id, self.ids, self.max_tokens, self.loop = rid, list(prompt_ids), max_tokens, loop
        self.out, self.generated, self.finish_reason, self.cancelled = asyncio.Queue(), 0, None, False

    def emit(self, item):  # from the engine thread to the request's handler
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class Engine:
    def __init__(self, model, eos_id, pad_id, inst, max_batch, plant_sync):
        self.model, self.eos_id, self.pad_id, self.inst = model, eos_id, pad_id, inst
        self.max_batch, self.plant_sync = max_batch, plant_sync
        self.waiting, self.running = queue.SimpleQueue(), []

    def run(self):  # the engine thread: the step thread of the probe
        while True:
            if not self.running:  # idle: block until a request comes (no steps while idle)
                self._admit(self.waiting.get())
            while len(self.running) < self.max_batch and not self.waiting.empty():
                self._admit(self.waiting.get_nowait())
            self.running = [r for r in self.running if not r.cancelled]
            if not self.running:
                continue
            with self.inst.step(has_work=True) as step:
                step.batch, step.running, step.waiting = len(self.running), len(self.running), self.waiting.qsize()
                step.tokens = sum(len(r.ids) for r in self.running)  # no KV cache: every token, every step
                next_ids = self.forward(self.running)
            for req, token in zip(self.running, next_ids):
                req.ids.append(token)
                req.generated += 1
                req.emit(token)
                if token == self.eos_id or req.generated >= req.max_tokens:
                    req.finish_reason = "stop" if token == self.eos_id else "length"
                    req.emit(None)
            self.running = [r for r in self.running if r.finish_reason is None]

    def _admit(self, req):
        self.running.append(req)
        self.inst.request_scheduled(req.id)

    @torch.inference_mode()
    def forward(self, batch):
        width = max(len(r.ids) for r in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - len(r.ids):] = torch.tensor(r.ids)
            mask[i, width - len(r.ids):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1, :]
        if self.plant_sync:
            logits.abs().max().item()  # PLANTED SYNC: a hidden device-to-host copy for the sync scan to find
        return sample(logits)


def sample(logits):
    return logits.argmax(dim=-1).tolist()  # greedy; the one deliberate sync of a step (allowlisted)


def make_app(engine, tokenizer, inst, served_name):
    counter = itertools.count()

    async def generate(request):
        body = await request.json()
        rid = f"cmpl-{next(counter)}"
        prompt_ids = tokenizer(body["prompt"]).input_ids
        inst.request_started(rid, input_tokens=len(prompt_ids), model=served_name,
                             max_tokens=int(body.get("max_tokens", 16)), trace_headers=request.headers)
        req = Request(rid, prompt_ids, int(body.get("max_tokens", 16)), asyncio.get_running_loop())
        engine.waiting.put(req)
        response = web.StreamResponse(headers={"Content-Type": "text/plain", "X-Request-Id": rid})
        finish_reason, sent = "abort", 0
        try:
            await response.prepare(request)
            while (token := await req.out.get()) is not None:
                if sent == 0:
                    inst.request_first_token(rid)
                await response.write(tokenizer.decode([token]).encode())
                sent += 1
            finish_reason = req.finish_reason
            await response.write_eof()
        finally:  # a client that left: its request leaves the batch, its span says aborted
            req.cancelled = finish_reason == "abort"
            inst.request_finished(rid, output_tokens=sent, finish_reason=finish_reason)
        return response

    async def health(request):
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.post("/generate", generate), web.get("/health", health)])
    return app


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a local model folder (sidecar make-model --out ...)")
    parser.add_argument("--served-name", default="local", help="the model's name in spans and metrics")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--plant-sync", action="store_true", help="switch the PLANTED SYNC line on")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    inst = sidecar.instrument(PROFILE, model=args.served_name)
    engine = Engine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, inst, args.max_batch, args.plant_sync)
    threading.Thread(target=engine.run, name="engine", daemon=True).start()
    try:
        web.run_app(make_app(engine, tokenizer, inst, args.served_name), host=args.host, port=args.port)
    finally:
        inst.close()


if __name__ == "__main__":
    main()
