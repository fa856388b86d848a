"""The summary's ``modules`` as text: which kind of layer, which module type, which module is slow."""

from __future__ import annotations

from typing import Callable


def format_modules(modules: dict, t: Callable[[float], str], shown: int = 10) -> list[str]:
    """Lines for ``sidecar analyze``; ``t`` writes a duration. One line when the trace has no modules."""
    if not modules.get("events"):
        return [f"Modules: {modules.get('note', 'none')}"]
    device = modules["kernel_time_us"] > 0
    basis = "kernel time launched inside each" if device else "host self time"
    lines = [f"Modules ({modules['events']:,} calls, {t(modules['total_us'])} in top-level modules"
             + (f", {t(modules['kernel_time_us'])} of kernels inside, {t(modules['kernel_outside_us'])} outside" if device else "")
             + f"; shares of {basis}):"]
    lines.append("  by kind of layer:")
    for row in modules["by_category"]:
        if row["calls"]:
            lines.append("    " + _figures(row, t, device) + f"  {row['category']}")
    lines.append("  by module type:")
    for row in modules["by_type"][:shown]:
        lines.append("    " + _figures(row, t, device) + f"  {row['type']} ({row['category']})")
    lines.append("  slowest modules:")
    for row in modules["top_modules"][:shown]:
        lines.append("    " + _figures(row, t, device) + f"  {row['path']}")
    return lines


def _figures(row: dict, t: Callable[[float], str], device: bool) -> str:
    if device:
        return f"{t(row['kernel_us']):>10} {row['kernel_fraction'] * 100:>5.1f}% {row['calls']:>6,}×"
    return (f"{t(row['self_us']):>10} {row['fraction'] * 100:>5.1f}% {row['calls']:>6,}×"
            f"  mean {t(row['mean_us']):>9}")
