"""Time per ``nn.Module``: torch.profiler's module hierarchy (``with_modules``) read back from a trace.

torch's Python tracer writes one ``python_function`` range per module call, named
``nn.Module: <Class>_<n>`` (``n`` numbers the instances of a class in the order torch first saw
them, so ``LlamaDecoderLayer_1`` is the same layer in every step). Those ranges nest like the calls
do; from them, per process:

* each call's **self time**: its duration minus that of the module calls directly inside it, so
  that the self times of all calls add up to the time spent in top-level modules (``total_us``,
  what the shares are of) and nothing is counted twice;
* its **kind of layer** (attention, MLP, norm, embedding, sampler/logits), from its class name
  (``_RULES``), or inherited from the module it runs in (a ``QKVParallelLinear`` inside an attention
  block is attention time), "other" when neither says;
* on a GPU trace, the **kernel time** of every kernel launched while the call was the innermost
  module on the launching thread: the kernel's launch (the runtime call with its correlation id,
  ``reader/ownership.py``) nests inside the module range on the host, which is how a kernel finds its
  module.

A trace without module ranges has none of this and the summary says so (``events`` 0); nothing is
guessed from op names.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from ..reader.arrays import distinct, isin
from ..reader.events import Kind
from .kernels import us
from ..reader.view import ProcessView

MODULE_PREFIX = "nn.Module: "
CATEGORIES = ("attention", "mlp", "norm", "embedding", "sampler", "other")
# (kind of layer, words in the lower-cased class name), first match wins: a logits processor or an
# LM head (an embedding subclass in vLLM) is sampling work, a rotary embedding belongs to attention.
_RULES = (
    ("sampler", ("sampler", "logits", "lmhead")),
    ("attention", ("attention", "attn", "rotary")),
    ("mlp", ("mlp", "feedforward", "ffn", "moe", "expert")),
    ("norm", ("norm",)),
    ("embedding", ("embed",)),
)
_INSTANCE = re.compile(r"^(.*)_(\d+)$")
ABSENT_NOTE = ("no nn.Module ranges in this trace: capture with with_modules=true (the module "
               "hierarchy of torch.profiler) to see time per module")


def category_of(type_name: str) -> str | None:
    """The kind of layer a module class's name says it is, or None (it inherits its parent's)."""
    low = type_name.lower()
    for category, words in _RULES:
        if any(w in low for w in words):
            return category
    return None


def type_of(instance: str) -> str:
    """``LlamaDecoderLayer_3`` → ``LlamaDecoderLayer``."""
    match = _INSTANCE.match(instance)
    return match.group(1) if match else instance


class ModuleStat(msgspec.Struct):
    calls: int = 0
    total: float = 0.0  # host time of the calls, nested modules included
    self_time: float = 0.0  # host time less the module calls directly inside
    kernel: float = 0.0  # kernel time launched while it was the innermost module

    def merge(self, other: "ModuleStat") -> None:
        self.calls += other.calls
        self.total += other.total
        self.self_time += other.self_time
        self.kernel += other.kernel


class ModuleStats(msgspec.Struct):
    events: int = 0
    total: float = 0.0  # host time in top-level module calls
    kernel_total: float = 0.0  # all kernel time of the process(es)
    kernel_in_modules: float = 0.0
    categories: dict[str, ModuleStat] = msgspec.field(default_factory=dict)
    types: dict[str, ModuleStat] = msgspec.field(default_factory=dict)
    type_category: dict[str, set] = msgspec.field(default_factory=dict)  # the kinds its calls counted in
    # (process label, path) → stat; the path names the instances from the outermost module down
    paths: dict[tuple[str, str], ModuleStat] = msgspec.field(default_factory=dict)
    path_category: dict[tuple[str, str], str] = msgspec.field(default_factory=dict)

    def merge(self, other: "ModuleStats") -> None:
        self.events += other.events
        self.total += other.total
        self.kernel_total += other.kernel_total
        self.kernel_in_modules += other.kernel_in_modules
        for mine, theirs in ((self.categories, other.categories), (self.types, other.types), (self.paths, other.paths)):
            for key, stat in theirs.items():
                mine.setdefault(key, ModuleStat()).merge(stat)
        for key, kinds in other.type_category.items():
            self.type_category.setdefault(key, set()).update(kinds)
        self.path_category.update(other.path_category)


def _module_names(names: list[str]) -> np.ndarray:
    return np.array([i for i, n in enumerate(names) if n.startswith(MODULE_PREFIX)], dtype=np.int32)


def _nearest(parent: np.ndarray, marked: np.ndarray, start: np.ndarray) -> np.ndarray:
    """For each event in ``start``: its innermost enclosing event that is ``marked``, or -1. Pointer
    jumping up the parent links, all events at once (a few dozen rounds: the nesting depth)."""
    out = np.full(len(start), -1, dtype=np.int64)
    cur = parent[start] if len(start) else np.zeros(0, dtype=np.int64)
    active = cur >= 0
    while active.any():
        safe = np.where(active, cur, 0)
        hit = active & marked[safe]
        out[hit] = cur[hit]
        active &= ~hit
        cur = np.where(active, parent[safe], -1)
        active &= cur >= 0
    return out


def module_stats(view: ProcessView) -> ModuleStats:
    stats = ModuleStats(kernel_total=_kernel_total(view))
    wanted = _module_names(view.data.names)
    if not len(wanted):
        return stats
    names = view.data.names
    kernel_by_thread = _kernels_by_launch_thread(view)
    for t, (tid, thread) in enumerate(view.threads.items()):
        python = thread.kind == Kind.PYTHON
        if not python.any():
            continue
        mods = np.flatnonzero(python & isin(thread.name, wanted))
        if not len(mods):
            continue
        tree = view.tree(tid)
        marked = np.zeros(len(thread.ts), dtype=bool)
        marked[mods] = True
        parent_of = _nearest(tree.parent, marked, mods)  # the module each call runs in, -1: top level
        kernel = np.zeros(len(thread.ts))
        launches = kernel_by_thread.get(t)
        if launches is not None:
            index, dur = launches
            owner = np.where(marked[index], index, _nearest(tree.parent, marked, index))
            inside = owner >= 0
            np.add.at(kernel, owner[inside], dur[inside])
            stats.kernel_in_modules += float(dur[inside].sum())
        _add_thread(stats, view.label, names, thread, mods, parent_of, kernel)
    return stats


def _add_thread(stats: ModuleStats, label: str, names: list[str], thread, mods: np.ndarray, parent_of: np.ndarray,
                kernel: np.ndarray) -> None:
    ts, dur = thread.ts[mods], thread.dur[mods]
    # Child module time, clipped to the parent's end (a child that outlives its parent by rounding).
    position = {int(m): k for k, m in enumerate(mods.tolist())}
    child = np.zeros(len(mods))
    has = parent_of >= 0
    if has.any():
        p = np.array([position[int(x)] for x in parent_of[has].tolist()], dtype=np.int64)
        end = np.minimum(ts[has] + dur[has], ts[p] + dur[p])
        np.add.at(child, p, np.maximum(end - ts[has], 0.0))
    self_time = np.maximum(dur - child, 0.0)
    stats.events += len(mods)
    stats.total += float(dur[~has].sum())
    # Parents before children: paths and inherited kinds are built top-down.
    order = np.lexsort((-dur, ts))
    path: dict[int, str] = {}
    kind: dict[int, str] = {}
    name_ids = thread.name[mods]
    for k in order.tolist():
        instance = names[int(name_ids[k])][len(MODULE_PREFIX):]
        module_type = type_of(instance)
        up = int(parent_of[k])
        up_k = position.get(up, -1) if up >= 0 else -1
        path[k] = f"{path[up_k]}/{instance}" if up_k >= 0 and up_k in path else instance
        category = category_of(module_type) or (kind.get(up_k) if up_k >= 0 else None) or "other"
        kind[k] = category
        call = ModuleStat(1, float(dur[k]), float(self_time[k]), float(kernel[int(mods[k])]))
        stats.categories.setdefault(category, ModuleStat()).merge(call)
        stats.types.setdefault(module_type, ModuleStat()).merge(call)
        stats.type_category.setdefault(module_type, set()).add(category)
        key = (label, path[k])
        stats.paths.setdefault(key, ModuleStat()).merge(call)
        stats.path_category[key] = category


def _kernel_total(view: ProcessView) -> float:
    if not len(view.gpu_index):
        return 0.0
    kind, dur = view.columns("kind", "dur")
    return float(dur[kind == Kind.KERNEL].sum())


def _kernels_by_launch_thread(view: ProcessView) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Kernels of the process by the thread that launched them: (index of the launch call in that
    thread, kernel duration)."""
    if not len(view.gpu_index):
        return {}
    kind, dur = view.columns("kind", "dur")
    known = (kind == Kind.KERNEL) & (view.launch_thread >= 0) & (view.launch_index >= 0)
    out = {}
    threads, index, durs = view.launch_thread[known], view.launch_index[known], dur[known]
    for t in distinct(threads).tolist():
        sel = threads == t
        out[int(t)] = (index[sel].astype(np.int64), durs[sel])
    return out


def _fraction(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole > 0 else 0.0


def _row(stat: ModuleStat, total: float, kernel_total: float) -> dict:
    return {
        "calls": stat.calls,
        "total_us": us(stat.total),
        "self_us": us(stat.self_time),
        "mean_us": us(stat.total / stat.calls) if stat.calls else 0.0,
        "fraction": _fraction(stat.self_time, total),
        "kernel_us": us(stat.kernel),
        "kernel_fraction": _fraction(stat.kernel, kernel_total),
    }


def to_json(stats: ModuleStats, top_n: int) -> dict:
    """Shares (``fraction``) are of ``total_us``, the time in top-level modules; kernel shares of the
    kernel time launched inside modules."""
    out: dict = {"events": stats.events, "total_us": us(stats.total),
                 "kernel_time_us": us(stats.kernel_in_modules),
                 "kernel_outside_us": us(max(stats.kernel_total - stats.kernel_in_modules, 0.0))}
    if not stats.events:
        out.update(note=ABSENT_NOTE, by_category=[], by_type=[], top_modules=[])
        return out
    ktotal = stats.kernel_in_modules
    # Ranked by device time where kernels were seen (a GPU trace), else by host self time.
    def rank(item):
        return (-(item[1].kernel if ktotal > 0 else item[1].self_time), str(item[0]))
    out["by_category"] = [{"category": c, **_row(stats.categories.get(c, ModuleStat()), stats.total, ktotal)}
                          for c in CATEGORIES]
    out["by_type"] = [{"type": t, "category": "+".join(sorted(stats.type_category[t])), **_row(s, stats.total, ktotal)}
                      for t, s in sorted(stats.types.items(), key=rank)[:top_n]]
    out["top_modules"] = [{"process": label, "path": p, "module": p.rsplit("/", 1)[-1],
                           "category": stats.path_category[(label, p)], **_row(s, stats.total, ktotal)}
                          for (label, p), s in sorted(stats.paths.items(), key=rank)[:top_n]]
    return out
