"""Build a small random-weight Llama model with a locally trained tokenizer: no model hub needed.

``sidecar make-model --size tiny --out models/tiny`` gives real vLLM something to serve on any machine.
Weights are random, so the text is nonsense, but every engine code path (tokenizer, chat template,
prefill, decode, sampling) runs for real. ``--size 126m`` gives the model the benchmarks use.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKER_FILE = "inference-sidecar-model.json"


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    dtype: str


SIZES = {
    # About 1M parameters: a 1-1.5 ms engine step on one CPU core, the harshest test of per-step cost.
    "tiny": ModelSize(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, dtype="float32"),
    # About 126M parameters: the benchmark model (about 15 ms per step on one CPU core).
    "126m": ModelSize(hidden=1024, layers=8, heads=16, kv_heads=4, intermediate=4096, dtype="bfloat16"),
}
VOCAB_SIZE = 2048


def _corpus(lines: int, seed: int) -> list[str]:
    """Generated English-ish text: enough for a byte-level BPE to learn real merges."""
    rng = random.Random(seed)
    words = (
        "the a an model server token request latency profile step kernel memory queue batch "
        "decode prefill cache engine worker trace sync time first output user system hello "
        "world fast slow gpu cpu tensor layer attention weight is was will can of to in on "
        "and or not with for by from as at this that these those it he she they we you"
    ).split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) + "." for _ in range(lines)]


def build_model(out: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write tokenizer + config + random weights to ``out`` and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    spec = SIZES[size]
    out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(4000, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        intermediate_size=spec.intermediate,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype=spec.dtype,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    (out / MARKER_FILE).write_text(json.dumps({"size": size, "parameters": params, "seed": seed}))
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "make-model",
        help="build a small random-weight model with a local tokenizer (no model hub)",
        description=__doc__.replace("``", "'"),  # the docstring's reStructuredText quotes, for a terminal
    )
    p.add_argument("--size", choices=sorted(SIZES), default="tiny",
                   help="tiny: 2 layers, for tests and the demo; 126m: the benchmarks' model (default %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="directory to write the model into")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default %(default)s)")
    p.add_argument("--quiet-if-exists", action="store_true", help="do nothing if --out already holds a model of this size")
    p.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    marker = args.out / MARKER_FILE
    if marker.exists():
        existing = json.loads(marker.read_text())
        if existing.get("size") == args.size and args.quiet_if_exists:
            return 0
    build_model(args.out, args.size, args.seed)
    meta = json.loads(marker.read_text())
    print(f"model: {args.out} ({args.size}, {meta['parameters'] / 1e6:.1f}M parameters)", file=sys.stderr)
    return 0
