"""The one exception the analyser raises for input it cannot read."""

from __future__ import annotations


class TraceFormatError(ValueError):
    """A trace file or folder that cannot be analysed: missing, empty, corrupt, truncated, or not a
    Chrome/Kineto trace. The message names the file and the problem (with a byte offset where one is
    known), so the CLI and the sidecar can show it as is instead of a traceback."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
