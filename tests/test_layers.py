"""The package's layers, read from the code's own imports: none goes up, none goes round.

Each product module (sidecar/**, plugins/sidecar_*/**) belongs to one layer of ``LAYERS`` (lowest first):
the first entry naming the module itself or its nearest enclosing package. An import may name its own
layer or a lower one, never a higher one, and no chain of imports may come back to where it began.
Every import counts, wherever it is written: at module level, inside a function (it runs when called),
under ``TYPE_CHECKING``, as a dotted string naming a module (``sidecar.cli``'s dispatch table,
``python -m``), and in a package's lazy ``__getattr__`` table (``sidecar/__init__.py``). Static: nothing is
imported, so the test needs neither torch nor an engine.

A new module goes into the folder of what it is about; a new folder gets a row here, in its place.
See docs/architecture.md, "The folder map, in layers".
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"sidecar": ROOT / "sidecar", "sidecar_vllm": ROOT / "plugins/sidecar_vllm",
            "sidecar_sglang": ROOT / "plugins/sidecar_sglang"}

LAYERS: list[tuple[str, ...]] = [
    ("sidecar.common", "sidecar.stacks"),        # the ground floor: imports nothing else of the package
    ("sidecar.syncs",),                          # the hidden-sync detector (runs in the engine)
    ("sidecar.engine",),                         # EngineProfile: what an integration tells the core
    ("sidecar.telemetry", "sidecar.probe.capture"),
    ("sidecar.probe",),
    ("sidecar.integration",),
    ("sidecar.instrumentation",),                # sidecar.instrument(...): the hand-written loop's API
    ("sidecar.analysis.reader",),
    ("sidecar.analysis.questions",),
    ("sidecar.analysis",),                       # analyze_path, the text report, sync sites of a trace
    ("sidecar.analysis.diff",),
    ("sidecar.report",),                         # analysis -> HTML
    ("sidecar.fleet",),                          # many sidecars: targets, discovery, fan-out, the comparison
    ("sidecar.service.export", "sidecar.service.metrics", "sidecar.service.store"),  # store: the object store's client
    ("sidecar.service.channel",),
    ("sidecar.service.jobs",),
    ("sidecar.service.incidents",),
    ("sidecar.service.pages",),
    ("sidecar.service.routes",),
    ("sidecar.service",),                        # the app shell
    ("sidecar.cli",),
    ("sidecar.devtools",),
    ("sidecar",),                                # the public API's lazy table
    ("sidecar_vllm", "sidecar_sglang"),          # engine integrations
]
GROUND = ("sidecar.common", "sidecar.stacks")
PUBLIC_ROOT = {"sidecar", "sidecar.engine", "sidecar.instrumentation"}  # the package root: its public API only
# aiohttp: in the service only its shell and its routes; elsewhere only these clients.
AIOHTTP = {"sidecar.service", "sidecar.service.routes", "sidecar.probe.link", "sidecar.devtools.traffic"}
MAX_MODULES_PER_FOLDER = 20  # aim for 15


def _modules() -> dict[str, Path]:
    out = {}
    for top, base in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([top, *parts])] = path
    return out


MODULES = _modules()


def _package(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _target(dotted: str) -> str | None:
    while dotted:
        if dotted in MODULES:
            return dotted
        dotted = dotted.rpartition(".")[0]
    return None


def _imports(name: str) -> list[tuple[str, int, str]]:
    """(imported product module, line, how) for every import ``name`` makes of another product module."""
    source = MODULES[name].read_text()
    tree = ast.parse(source)
    pkg = _package(name)
    lazy = MODULES[name].name == "__init__.py" and "def __getattr__" in source
    out = []

    def add(dotted: str, line: int, how: str) -> None:
        target = _target(dotted)
        if target and target != name:
            out.append((target, line, how))

    def relative(level: int, module: str | None) -> str:
        parts = pkg.split(".")
        parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
        return ".".join(parts + (module.split(".") if module else []))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    add(alias.name, node.lineno, "import")
        elif isinstance(node, ast.ImportFrom):
            base = relative(node.level, node.module) if node.level else (node.module or "")
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in MODULES else base, node.lineno, f"from {base} import {alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            v = node.value
            if "." in v and " " not in v and v.split(".")[0] in PACKAGES and v in MODULES:
                add(v, node.lineno, f"string {v!r}")
            elif lazy and v.startswith(".") and v.strip(".").replace("_", "").replace(".", "").isalnum():
                level = len(v) - len(v.lstrip("."))
                full = relative(level, v.lstrip(".") or None)
                if full in MODULES:
                    add(full, node.lineno, f"lazy {v!r}")
    return out


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> int | None:
    for candidate in (name, *(_package(name).rsplit(".", i)[0] for i in range(_package(name).count(".") + 1))):
        for i, layer in enumerate(LAYERS):
            if candidate in layer:
                return i
    return None


def test_every_module_has_a_layer():
    assert not [n for n in MODULES if _layer(n) is None]


def test_no_import_goes_up():
    up = [f"{src}:{line} (layer {_layer(src)}) -> {dst} (layer {_layer(dst)}): {how}"
          for src, edges in GRAPH.items() for dst, line, how in edges if _layer(dst) > _layer(src)]
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def test_no_import_cycles():
    """Tarjan's strongly connected components over every import (module level, in functions, strings)."""
    index, low, on, stack, cycles = {}, {}, set(), [], []
    succ = {n: sorted({d for d, _, _ in edges}) for n, edges in GRAPH.items()}
    for start in MODULES:
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start), on.add(start)
        work = [(start, iter(succ[start]))]
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w), on.add(w)
                    work.append((w, iter(succ[w])))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        cycles.append(sorted(comp))
    assert not cycles, f"import cycles: {cycles}"


def test_the_ground_floor_imports_nothing_else_of_the_package():
    out = [f"{src}:{line} -> {dst}" for src, edges in GRAPH.items() for dst, line, _ in edges
           for floor in GROUND if (src == floor or src.startswith(floor + "."))
           and not (dst == floor or dst.startswith(floor + "."))]
    assert not out, out


def test_only_the_service_shell_and_its_routes_import_aiohttp():
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] == "aiohttp" for n in names) and name not in AIOHTTP and _package(name) not in AIOHTTP:
                found.append(f"{name}:{node.lineno}")
    assert not found, found


def test_no_folder_holds_more_than_twenty_modules():
    folders = defaultdict(list)
    for name, path in MODULES.items():
        folders[path.parent.relative_to(ROOT).as_posix()].append(name)
    big = {f: len(v) for f, v in folders.items() if len(v) > MAX_MODULES_PER_FOLDER}
    assert not big, big


def test_the_package_root_holds_only_the_public_api():
    assert {n for n, p in MODULES.items() if p.parent == PACKAGES["sidecar"]} == PUBLIC_ROOT


def test_a_package_init_imports_only_its_own_folder():
    """Importing sidecar.x.y runs sidecar/x/__init__.py first: an __init__ that imported another folder
    would bring that folder along with every module under it, whatever the layers say. A PEP 562 table
    (sidecar/syncs/__init__.py's ``SyncSpec``) loads on first use, not on import: allowed."""
    out = [f"{src}:{line} -> {dst}" for src, edges in GRAPH.items() if MODULES[src].name == "__init__.py"
           and src != "sidecar" for dst, line, how in edges
           if not dst.startswith(src + ".") and not how.startswith("lazy")]  # a lazy table loads on first use
    assert not out, out
