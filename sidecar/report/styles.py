"""The pages' one style sheet, inline (a report must open from a file with no network): system fonts,
tables and the colours the charts use, so that a legend and its chart cannot disagree."""

from __future__ import annotations

# Gap causes (docs/analysis.md, "Idle gaps"), in the analyser's order; the colours mean the same on
# every chart and legend of a report.
CAUSE_COLOURS = {"sync": "#d62728", "memcpy": "#9467bd", "launch": "#ff7f0e", "host": "#1f77b4",
                 "unknown": "#7f7f7f"}
# The phases of a step (sidecar/common/phases.py), in the order a step runs them, and the rest of a step.
# None is a gap cause's colour: a GPU trace's timeline shows both.
PHASE_COLOURS = {"input": "#8c564b", "schedule": "#e377c2", "dispatch": "#bcbd22", "wait_model": "#c7c7c7",
                 "prepare": "#17becf", "forward": "#00876c", "sample": "#f0c419", "update": "#393b79",
                 "output": "#637939", "unphased": "#eef0f2"}
BAR = "#2b7bba"
BAR_LIGHT = "#c6dbef"
STEP = "#4c9f70"
STEP_CUT = "#bbbbbb"
SYNC = "#d62728"

CSS = """
:root { color-scheme: light; --fg: #1d232a; --muted: #5b6670; --line: #d9dee3; --bg-alt: #f5f7f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); }
header { padding: 14px 24px; border-bottom: 1px solid var(--line); background: var(--bg-alt); }
header h1 { margin: 0; font-size: 20px; }
header p { margin: 4px 0 0; color: var(--muted); }
main { padding: 8px 24px 40px; max-width: 1200px; }
section { margin-top: 22px; }
h2 { font-size: 17px; margin: 0 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
.headline { font-size: 16px; font-weight: 600; margin: 10px 0 4px; }
.muted, .note { color: var(--muted); }
.note { font-size: 13px; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { padding: 3px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: var(--bg-alt); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.name { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; }
#live > div { margin-top: 18px; }
.id { white-space: nowrap; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
ul.findings li { margin: 3px 0; }
.warn { background: #fff4e5; border-left: 3px solid #ff9800; padding: 4px 8px; margin: 4px 0; }
svg { display: block; max-width: 100%; height: auto; margin: 4px 0; }
svg text { font: 11px system-ui, sans-serif; fill: #1d232a; }
svg text.small { font-size: 10px; fill: #5b6670; }
svg text.on-bar { fill: #fff; font-size: 10px; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: -1px; }
.legend i.c-sync { background: #d62728; } .legend i.c-memcpy { background: #9467bd; }
.legend i.c-launch { background: #ff7f0e; } .legend i.c-host { background: #1f77b4; }
.legend i.c-unknown { background: #7f7f7f; } .legend i.c-step { background: #4c9f70; }
.legend i.c-cut { background: #bbbbbb; } .legend i.c-syncmark { background: #d62728; border-radius: 5px; }
.state { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; background: var(--bg-alt);
         border: 1px solid var(--line); }
.state-done { background: #e3f4e8; border-color: #9fd3ad; }
.state-failed { background: #fde8e8; border-color: #f0a8a8; }
.state-partial { background: #fff4e5; border-color: #ffc680; } .state-cancelled { color: var(--muted); }
.state-capturing, .state-scanning, .state-armed, .state-exporting { background: #e6f0fb; border-color: #9cc2ea; }
form.start { display: grid; grid-template-columns: 10em 1fr; gap: 6px 12px; align-items: center;
             max-width: 880px; padding: 10px 12px; margin: 0 0 22px; border: 1px solid var(--line);
             background: var(--bg-alt); }
form.start output:empty { display: none; }
form.start .wide { grid-column: 1 / span 2; }
form.start input[type=text], form.start input[type=number], form.start select { width: 16em; }
form.start label.inline { margin-right: 12px; }
[aria-invalid=true] { outline: 2px solid #d62728; }
output { display: block; min-height: 1.4em; }
.headline output { display: inline; margin-left: 10px; font-weight: normal; }
.headline button { margin-left: 10px; }
output.error { color: #b3261e; } output.ok { color: #1e7d32; }
details { margin: 6px 0; } summary { cursor: pointer; color: var(--muted); }
button { font: inherit; padding: 3px 12px; }
.toolbar button { margin: 0 4px 0 0; } .toolbar output, .toolbar span { display: inline; margin-left: 10px; }
button[aria-pressed=true] { background: #2b7bba; color: #fff; border: 1px solid #2b7bba; }
p.stuck { background: #fde8e8; border-left: 4px solid #d62728; color: #8b1a14; font-weight: 600; padding: 6px 10px; margin: 6px 0; }
svg.timeline .grid { stroke: #e6e9ec; } svg.timeline text.title { font-weight: 600; }
svg.timeline .step-max { stroke-width: 1.4; } svg.timeline circle.slow { stroke: #d62728; stroke-width: 2; cursor: pointer; }
svg.timeline circle.top { opacity: 0.7; cursor: pointer; } svg.timeline .gc { fill: #ff7f0e; }
svg.timeline .open-step { fill: #d62728; } svg.timeline .capture-mark { fill: #2b7bba; fill-opacity: 0.12; }
svg.timeline .firing-mark { stroke: #9467bd; stroke-width: 1.5; stroke-dasharray: 4 3; }
svg.timeline .e2e { stroke: #1d232a; stroke-width: 1.3; } svg.timeline .ttft { stroke: #ff7f0e; stroke-width: 1.3; }
svg.swatch { display: inline-block; margin: 0 4px 0 0; vertical-align: -1px; }
.legend span.k-e2e { border-top: 2px solid #1d232a; } .legend span.k-ttft { border-top: 2px solid #ff7f0e; }
.legend span.k-gc { border-top: 4px solid #ff7f0e; } .legend span.k-capture { border-top: 6px solid #d5e4f1; }
.legend span.k-firing { border-top: 2px dashed #9467bd; }
#step-panel { border: 1px solid var(--line); background: var(--bg-alt); padding: 6px 12px; margin: 8px 0; max-width: 880px; }
#step-panel input[type=number] { width: 5em; margin-right: 4px; }
ol.frames { margin: 2px 0 6px; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
details.step-thread > summary { color: var(--fg); font-weight: 600; } .stacks-process h4 { margin: 10px 0 2px; }
p.error { color: #b3261e; }
""" + "".join(f".legend i.p-{phase} {{ background: {colour}; }}\n" for phase, colour in PHASE_COLOURS.items())
