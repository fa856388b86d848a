"""The home page's start forms: one field per parameter of ``/profile/start`` and ``/sync/start``,
taken from the parser's own definitions (sidecar/service/jobs/params.py), so that the form cannot offer
a parameter the API does not take, nor leave one out (tests/report checks both directions).

The fields are text, sent as typed: the API is the one validator, and its answer (``param`` and
``message``) is shown beside the form with the field marked. Ranges appear as hints only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...common import config
from ...common.protocol import DEFAULT_STACK_HZ, MAX_STACK_HZ
from ..jobs.params import ACTIVITIES, BACKENDS, BOOLEAN_OPTIONS, KNOWN, MIN_STACK_HZ, SCAN_KNOWN, STACK_MODES
from ...report.markup import esc, tag

# Not on the form: the older spelling of ``stacks`` (with_stack=true is stacks=sampled: the form offers
# ``stacks`` alone), and ``fleet``, the id `sidecar fleet capture` gives every replica's capture.
LEFT_OUT = {"with_stack", "fleet"}


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    kind: str  # "text", "check" (one boolean), "checks" (a comma-separated list), "select"
    hint: str = ""
    choices: tuple[str, ...] = ()
    value: str = ""
    datalist: str | None = None


def capture_fields(max_steps: int) -> list[Field]:
    return [
        Field("steps", "Steps", "text", f"working steps to record, 1–{max_steps}", value="5"),
        Field("delay", "Delay", "text", f"working steps to skip first, 0–{max_steps} (default 0)"),
        Field("processes", "Processes", "text", "all, or roles, optionally role:rank: worker:0,engine_core",
              datalist="roles"),
        _instance(),
        Field("activities", "Activities", "checks", "none ticked: what each host has", choices=ACTIVITIES),
        Field("stacks", "Python stacks", "select", "docs/api.md, Python stacks", choices=STACK_MODES),
        Field("stack_hz", "Stack rate (Hz)", "text",
              f"sampled stacks: {MIN_STACK_HZ:g}–{MAX_STACK_HZ:g} (default {DEFAULT_STACK_HZ:g})"),
        *[Field(name, name.replace("_", " ").capitalize(), "check", "torch.profiler option")
          for name in BOOLEAN_OPTIONS],
        Field("backend", "Backend", "select",
              "nsys: marks the steps for an engine run under nsys launch (docs/gpu.md); no torch option then",
              choices=BACKENDS),
        Field("timeout_s", "Timeout (s)", "text",
              f"the whole capture, (0, {config.MAX_CAPTURE_TIMEOUT_S:g}] "
              f"(default {config.DEFAULT_CAPTURE_TIMEOUT_S:g})"),
    ]


def scan_fields(max_steps: int) -> list[Field]:
    return [
        Field("steps", "Steps", "text", f"working steps to scan, 1–{max_steps}", value="20"),
        Field("delay", "Delay", "text", f"working steps to skip first, 0–{max_steps} (default 0)"),
        Field("processes", "Processes", "text", "all, or roles, optionally role:rank", datalist="roles"),
        _instance(),
        Field("timeout_s", "Timeout (s)", "text", f"(0, {config.MAX_CAPTURE_TIMEOUT_S:g}] "
                                                  f"(default {config.DEFAULT_CAPTURE_TIMEOUT_S:g})"),
        Field("baseline", "Baseline", "text", "an earlier scan's id: report only new sites", datalist="scan-ids"),
    ]


def _instance() -> Field:
    return Field("instance", "Engine instance", "text", "one engine instance as /processes names it (default: all)",
                 datalist="instances")


def start_form(ident: str, api: str, fields: list[Field], button: str) -> str:
    rows = "".join(_field(ident, f) for f in fields)
    actions = (tag("div", tag("button", esc(button), type="submit"), class_="wide")
               + tag("output", "", class_="wide", id=f"{ident}-out", aria_live="polite"))
    return tag("form", rows + actions, id=ident, class_="start", data_api=api, autocomplete="off")


def _field(form: str, f: Field) -> str:
    ident = f"{form}-{f.name}"
    hint = tag("span", esc(f.hint), class_="note") if f.hint else ""
    if f.kind == "check":
        control = tag("label", f'<input type="checkbox" name="{esc(f.name)}" id="{esc(ident)}" value="true"> '
                      + hint, class_="inline")
    elif f.kind == "checks":
        control = "".join(tag("label", f'<input type="checkbox" name="{esc(f.name)}" value="{esc(c)}" '
                                       f'data-list="1"> {esc(c)}', class_="inline") for c in f.choices) + hint
    elif f.kind == "select":
        control = tag("select", "".join(tag("option", esc(c), value=c) for c in f.choices),
                      name=f.name, id=ident, data_omit=f.choices[0]) + " " + hint
    else:
        control = tag("input", "", type="text", name=f.name, id=ident, value=f.value or None,
                      list=f.datalist, spellcheck="false").replace("></input>", ">") + " " + hint
    name = tag("span", esc(f.label)) if f.kind == "checks" else tag("label", esc(f.label), for_=ident)
    return name + tag("div", control)


def form_names(fields: list[Field]) -> set[str]:
    return {f.name for f in fields}


CAPTURE_NAMES = KNOWN - LEFT_OUT
SCAN_NAMES = SCAN_KNOWN
