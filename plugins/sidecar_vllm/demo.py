"""``make demo``: real vLLM with the local model, the sidecar, streaming traffic, a 5-step capture.

Prints what was captured (processes, steps, files), the analysis headline and top operations, and
exits 0 when the capture is complete. ``--model DIR`` points it at any local model directory.
"""

from __future__ import annotations

import sys

from sidecar.devtools import demo

from .devtools import VllmStack


def main(argv: list[str] | None = None) -> int:
    return demo.main(VllmStack, argv, prog="python -m sidecar_vllm.demo", description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
