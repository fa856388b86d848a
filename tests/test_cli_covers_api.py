"""A new user can do everything in docs/api.md from the `sidecar` command: every endpoint heading there is
named in docs/cli.md's command table (or is one of the few that are not for people), and every command
that table names exists."""

from __future__ import annotations

import re
from pathlib import Path

from sidecar.cli import _COMMAND_MODULES

DOCS = Path(__file__).resolve().parents[1] / "docs"
ENDPOINT = re.compile(r"`((?:[A-Z]+\|)*[A-Z]+) (/[^`\s]*)`")
# Not for people: the engine processes' own channel and metric push, and the machine-readable API description;
# not for a shell: the home page, a browser's view of what `status`, `list`, `capture` and `sync` do.
# and the home page's chart (its read of the recorder, made for a browser that refreshes it).
NOT_COMMANDS = {("GET", "/probe/ws"), ("POST", "/v1/metrics"), ("GET", "/openapi.json"), ("GET", "/"),
                ("GET", "/recorder/timeline")}


def _headings() -> list[set[tuple[str, str]]]:
    """Each endpoint heading of api.md as the set of (method, path) it documents (`GET|POST /x`: either will do)."""
    out = []
    for line in (DOCS / "api.md").read_text().splitlines():
        if re.match(r"#{2,4} ", line):
            for methods, path in ENDPOINT.findall(line):
                out.append({(m, path) for m in methods.split("|")})
    return out


def _cli_table() -> list[str]:
    return [line for line in (DOCS / "cli.md").read_text().splitlines() if line.startswith("| `sidecar ")]


def test_every_endpoint_has_a_command():
    covered = {(m, p) for row in _cli_table() for m, p in ENDPOINT.findall(row.rsplit("|", 2)[-2])}
    missing = [sorted(h)[0] for h in _headings() if not (h & covered) and not (h & NOT_COMMANDS)]
    assert len(_headings()) > 20, "api.md's endpoint headings were not found"
    assert not missing, f"endpoints in docs/api.md with no command in docs/cli.md: {missing}"


def test_every_command_in_the_table_exists():
    named = {re.match(r"\| `sidecar ([a-z-]+)", row).group(1) for row in _cli_table()}
    assert named == set(_COMMAND_MODULES), (sorted(named - set(_COMMAND_MODULES)), sorted(set(_COMMAND_MODULES) - named))
