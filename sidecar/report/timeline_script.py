"""The home page's last minutes, the part of the pages' one script (script.py) that draws them.

``loadTimeline``: the chart from ``GET /recorder/timeline`` as SVG, every 3 s while the tab is visible,
a slow step's row on a click with its two actions (download that window, capture the next steps), the
requests in flight, a stuck step, the stacks of every process on a click. Not a script of its own:
script.py puts this text inside its one function, between the helpers it uses (``headers``, ``say``,
``save``, ``post``) and the event handlers that call it, and the pages allow that whole script by
its hash.
"""

TIMELINE_SCRIPT = r"""  // -- The last minutes (the home page's #recorder): GET /recorder/timeline, drawn as SVG, again every
  // REFRESH_MS while the tab is visible (never while hidden). Every element is made here and every
  // string set as text: what an engine names (labels, request ids, frames) never becomes markup.
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = ["#2b7bba", "#4c9f70", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  const REFRESH_MS = 3000;
  const PAD_MS = 5000;  // a slow step's download: this much before and after it
  const timeline = {seconds: 600, timer: null, loading: false, data: null, slow: []};
  function make(name, attrs, text) {
    const node = name.startsWith("svg:") ? document.createElementNS(SVG, name.slice(4)) : document.createElement(name);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function clock(ns) { return new Date(ns / 1e6).toISOString().slice(11, 19); }  // UTC, as the page's other times
  function ms(v) {
    if (v === null || v === undefined) return "–";
    return v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(v < 10 ? 2 : 1) + " ms";
  }
  function pause(seconds) { return new Promise((done) => setTimeout(done, seconds * 1000)); }
  function status(text, kind) {
    const out = document.getElementById("timeline-status");
    if (out) { out.textContent = text; out.className = kind || "muted"; }
  }
  function chartWidth() {
    const chart = document.getElementById("chart");
    return Math.max(600, Math.min(1400, (chart && chart.clientWidth) || 1100));
  }
  async function loadTimeline() {
    clearTimeout(timeline.timer);
    if (!document.getElementById("recorder") || timeline.loading) return;
    if (document.visibilityState === "hidden") return;  // visibilitychange starts it again
    timeline.loading = true;
    const points = Math.min(600, Math.max(60, Math.round((chartWidth() - 70) / 3)));
    try {
      const resp = await fetch("/recorder/timeline?seconds=" + timeline.seconds + "&points=" + points,
                               {headers: headers({"Accept": "application/json"}), cache: "no-store"});
      if (resp.ok) {
        timeline.data = await resp.json();
        drawTimeline(timeline.data);
        status("updated " + clock(timeline.data.read_ns) + " UTC, every " + REFRESH_MS / 1000 + " s");
      } else {
        status("the sidecar answered " + resp.status + " " + resp.statusText, "error");
      }
    } catch (err) {
      status("the sidecar did not answer", "error");
    } finally {
      timeline.loading = false;
    }
    if (document.visibilityState !== "hidden") timeline.timer = setTimeout(loadTimeline, REFRESH_MS);
  }
  function drawTimeline(data) {
    drawStuck(data.stuck || []);
    drawChart(data);
    drawInFlight(data.in_flight || {count: 0, requests: []});
  }
  function drawStuck(stuck) {
    const box = document.getElementById("stuck");
    if (!box) return;
    box.replaceChildren();
    for (const s of stuck) {
      const top = (s.frames || [])[0];
      box.append(make("p", {class: "stuck"}, s.process + ": step " + s.step + " stuck for " + s.age_s +
        " s (watchdog at " + s.threshold_s + " s)" + (top ? ", in " + top.function + " (" + top.file + ":" + top.line + ")" : "")));
    }
  }
  function scale(values, floor) {  // a log scale's decades around the values
    const shown = values.filter((v) => v > 0);
    const hi = Math.pow(10, Math.ceil(Math.log10(Math.max(floor * 10, ...shown))));
    const lo = Math.pow(10, Math.floor(Math.log10(Math.max(floor, Math.min(hi / 10, ...shown)))));
    return {lo: lo, hi: hi};
  }
  function axis(svg, s, top, height, left, right, unit) {
    const y = (v) => top + height - (Math.log10(Math.max(v, s.lo)) - Math.log10(s.lo)) / (Math.log10(s.hi) - Math.log10(s.lo)) * height;
    for (let v = s.lo; v <= s.hi * 1.001; v *= 10) {
      svg.append(make("svg:line", {x1: left, x2: right, y1: y(v), y2: y(v), class: "grid"}));
      svg.append(make("svg:text", {x: left - 4, y: y(v) + 4, "text-anchor": "end", class: "small"}, ms(v)));
    }
    svg.append(make("svg:text", {x: 4, y: top + 10, class: "small"}, unit));
    return y;
  }
  function polyline(svg, points, attrs) {  // one line per run of points; a gap of more than one bucket breaks it
    let run = [];
    const flush = () => {
      if (run.length > 1) svg.append(make("svg:polyline", Object.assign({points: run.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ")}, attrs)));
      if (run.length === 1) svg.append(make("svg:circle", Object.assign({cx: run[0][0], cy: run[0][1], r: 1.5}, attrs)));
      run = [];
    };
    for (const p of points) {
      if (run.length && p[2] - run[run.length - 1][2] > 1) flush();
      run.push(p);
    }
    flush();
  }
  function drawChart(data) {
    const chart = document.getElementById("chart");
    if (!chart) return;
    const W = chartWidth(), left = 64, right = W - 12, stepTop = 24, stepH = 200, reqTop = stepTop + stepH + 46,
          reqH = 110, axisY = reqTop + reqH, H = axisY + 22;
    const span = data.until_ns - data.since_ns;
    const x = (ns) => left + Math.min(1, Math.max(0, (ns - data.since_ns) / span)) * (right - left);
    const bucket = (ns) => Math.floor((ns - data.since_ns) / data.bucket_ns);
    const svg = make("svg:svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H, class: "timeline", role: "img",
                                 "aria-label": "step time per engine process, and the finished requests, over the last " + Math.round(data.seconds / 60) + " minutes"});
    const stepValues = [], reqValues = [];
    for (const p of data.processes) {
      for (const b of p.buckets) stepValues.push(b.max_ms);
      for (const s of p.slow_steps) stepValues.push(s.duration_ms);
    }
    for (const b of data.requests.buckets) reqValues.push(b.e2e_max_ms, b.ttft_max_ms || 0);
    // Marks first, under the lines: captures as bands, trigger firings as lines.
    for (const c of data.marks.captures) {
      const x0 = x(c.start_ns), x1 = x(c.end_ns || data.until_ns);
      const band = make("svg:rect", {x: x0, y: stepTop, width: Math.max(2, x1 - x0), height: axisY - stepTop, class: "capture-mark"});
      band.append(make("svg:title", {}, "capture " + c.id + " (" + c.state + ")"));
      svg.append(band);
    }
    for (const f of data.marks.firings) {
      const line = make("svg:line", {x1: x(f.at_ns), x2: x(f.at_ns), y1: stepTop, y2: axisY, class: "firing-mark " + f.outcome});
      line.append(make("svg:title", {}, "trigger " + (f.name || f.trigger) + " " + f.outcome + ": " + f.metric + " " + ms(f.observed_ms) +
                                      " over " + ms(f.threshold_ms) + (f.capture ? ", capture " + f.capture : "")));
      svg.append(line);
    }
    svg.append(make("svg:text", {x: left, y: stepTop - 8, class: "title"}, "Step time per engine process (longest of each moment; dots: slow steps, click one)"));
    const ys = axis(svg, scale(stepValues, 0.1), stepTop, stepH, left, right, "step");
    timeline.slow = [];
    const legend = [];
    data.processes.forEach((p, i) => {
      const colour = COLOURS[i % COLOURS.length];
      const label = (p.process && p.process.label) || "process";
      legend.push([label + (p.error ? " (" + p.error + ")" : p.note ? " (" + p.note + ")" : ""), colour]);
      polyline(svg, p.buckets.map((b) => [x(b.start_ns + data.bucket_ns / 2), ys(b.max_ms), bucket(b.start_ns)]),
               {class: "step-max", stroke: colour, fill: "none"});
      if (p.open_step) {
        const bar = make("svg:rect", {x: x(p.open_step.since_ns), y: stepTop + stepH - 6, height: 6,
                                      width: Math.max(2, x(data.until_ns) - x(p.open_step.since_ns)), class: "open-step"});
        bar.append(make("svg:title", {}, label + ": a step running for " + ms(p.open_step.age_ms)));
        svg.append(bar);
      }
      for (const g of p.gc) {
        const mark = make("svg:rect", {x: x(g.start_ns) - 2, y: stepTop + stepH + 2, width: 4, height: 6, class: "gc"});
        mark.append(make("svg:title", {}, label + ": GC pause " + ms(g.duration_ms) + " (generation " + g.generation + (g.step_thread ? ", on the step thread)" : ")")));
        svg.append(mark);
      }
      for (const s of p.slow_steps) {
        const index = timeline.slow.push({process: p.process, row: s}) - 1;
        const dot = make("svg:circle", {cx: x(s.start_ns), cy: ys(s.duration_ms), r: s.over ? 5 : 2.5, fill: colour,
                                        class: s.over ? "slow" : "top", "data-slow": index, tabindex: 0});
        dot.append(make("svg:title", {}, label + ": step " + s.step + ", " + ms(s.duration_ms) + (s.over ? " (over " + ms(p.slow_ms) + ")" : "")));
        svg.append(dot);
      }
    });
    svg.append(make("svg:text", {x: left, y: reqTop - 8, class: "title"}, "Finished requests: TTFT and end-to-end (longest of each moment)"));
    const yr = axis(svg, scale(reqValues, 1), reqTop, reqH, left, right, "request");
    const reqs = data.requests.buckets;
    polyline(svg, reqs.map((b) => [x(b.start_ns + data.bucket_ns / 2), yr(b.e2e_max_ms), bucket(b.start_ns)]), {class: "e2e", fill: "none"});
    polyline(svg, reqs.filter((b) => b.ttft_max_ms !== null).map((b) => [x(b.start_ns + data.bucket_ns / 2), yr(b.ttft_max_ms), bucket(b.start_ns)]),
             {class: "ttft", fill: "none"});
    for (let k = 0; k <= 6; k++) {
      const ns = data.since_ns + span * k / 6;
      svg.append(make("svg:text", {x: x(ns), y: axisY + 16, "text-anchor": k === 0 ? "start" : k === 6 ? "end" : "middle", class: "small"}, clock(ns)));
    }
    const keys = make("p", {class: "legend"});
    for (const [text, colour] of legend) {
      const swatch = make("svg:svg", {width: 12, height: 10, class: "swatch"});
      swatch.append(make("svg:rect", {width: 12, height: 10, fill: colour}));
      const item = make("span");
      item.append(swatch, document.createTextNode(text));
      keys.append(item);
    }
    for (const [text, cls] of [["end-to-end", "k-e2e"], ["TTFT", "k-ttft"], ["GC pause", "k-gc"], ["capture", "k-capture"], ["trigger firing", "k-firing"]]) {
      keys.append(make("span", {class: cls}, text));
    }
    const counts = make("p", {class: "muted"}, data.processes.length ? data.processes.map((p) =>
      ((p.process && p.process.label) || "process") + ": " + p.steps + " steps").join(" · ") + " · " + data.requests.finished + " requests finished"
      : "No engine process is connected.");
    chart.replaceChildren(svg, keys, counts);
  }
  function drawInFlight(inFlight) {
    const box = document.getElementById("in-flight");
    if (!box) return;
    if (!inFlight.count) { box.replaceChildren(make("p", {class: "muted"}, "None.")); return; }
    const table = make("table", {id: "in-flight-table"});
    const head = make("tr");
    for (const h of ["request", "age", "phase", "prompt tokens", "output tokens", "process"]) head.append(make("th", {}, h));
    const body = make("tbody");
    for (const r of inFlight.requests) {
      const tr = make("tr");
      for (const v of [r.id, ms(r.age_ms), r.phase, r.prompt_tokens, r.output_tokens, r.process]) {
        tr.append(make("td", {}, v === null || v === undefined ? "–" : v));
      }
      body.append(tr);
    }
    const thead = make("thead");
    thead.append(head);
    table.append(thead, body);
    const more = inFlight.count > inFlight.requests.length ? [make("p", {class: "muted"}, (inFlight.count - inFlight.requests.length) + " more")] : [];
    box.replaceChildren(make("p", {}, inFlight.count + " in flight, oldest first"), table, ...more);
  }
  const SHOWN = [["start_ns", "started (UTC)", (v) => clock(v)], ["end_ns", "ended (UTC)", (v) => clock(v)],
                 ["duration_ms", "duration", ms], ["working", "working", (v) => v ? "yes" : "no"], ["batch", "batch"],
                 ["tokens", "tokens"], ["prefill_tokens", "prefill tokens"], ["decode_tokens", "decode tokens"],
                 ["running", "running"], ["waiting", "waiting"], ["gc_ms", "GC inside the step", ms]];
  function showStep(entry) {
    const panel = document.getElementById("step-panel");
    if (!panel || !entry) return;
    const row = entry.row, label = (entry.process && entry.process.label) || "process";
    const body = make("tbody");
    const add = (name, value) => {
      const tr = make("tr");
      tr.append(make("th", {}, name), make("td", {}, value === null || value === undefined ? "–" : value));
      body.append(tr);
    };
    const known = new Set(["step", "over"]);
    for (const [key, name, show] of SHOWN) { known.add(key); add(name, show && row[key] !== null ? show(row[key]) : row[key]); }
    for (const [key, value] of Object.entries(row)) if (!known.has(key)) add(key.replace(/_/g, " "), value);  // a newer probe's columns
    const table = make("table", {class: "step-row"});
    table.append(body);
    const out = make("output", {id: "step-out"});
    const download = make("button", {type: "button", id: "download-window"}, "Download this window as a Perfetto trace");
    download.addEventListener("click", () => downloadWindow(row, out));
    const chart = document.getElementById("chart");
    const steps = make("input", {type: "number", id: "capture-steps", name: "steps", min: 1, value: 5,
                                 max: (chart && chart.dataset.maxSteps) || 50, "aria-label": "steps to capture"});
    const capture = make("button", {type: "button", id: "capture-next"}, "Capture the next N steps");
    capture.addEventListener("click", () => post("/profile/start", {steps: steps.value}, out, null, "Started capture"));
    const actions = make("p", {class: "toolbar"});
    actions.append(download, " ", steps, capture);
    panel.replaceChildren(make("h3", {}, label + ": step " + row.step + ", " + ms(row.duration_ms) + (row.over ? " (slow)" : "")),
                          table, actions, out);
    panel.hidden = false;
  }
  async function answerError(resp) {  // the API's JSON error as a line of text
    try {
      const answer = await resp.json();
      if (answer && answer.message) return (answer.param ? answer.param + ": " : "") + answer.message;
    } catch (err) { /* not JSON: the status says it */ }
    return resp.status + " " + resp.statusText;
  }
  async function fetchBusy(url) {  // a 429 (another recorder or stacks query holds a process): retried as it says
    for (let attempt = 0; ; attempt++) {
      const resp = await fetch(url, {headers: headers({"Accept": "application/json"}), cache: "no-store"});
      if (resp.status !== 429 || attempt >= 3) return resp;
      await pause(Math.min(5, Number(resp.headers.get("Retry-After")) || 1));
    }
  }
  async function downloadWindow(row, out) {
    const start = Math.floor(row.start_ns / 1e6) - PAD_MS;
    const duration = Math.ceil((row.end_ns - row.start_ns) / 1e6) + 2 * PAD_MS;
    say(out, null, "Asking the flight recorder…");
    let resp, blob;
    try {
      resp = await fetchBusy("/recorder?format=trace&start_ms=" + start + "&duration_ms=" + duration);
      if (resp.ok) blob = await resp.blob();
    } catch (err) {
      say(out, "error", "The sidecar did not answer: " + err);
      return;
    }
    if (!resp.ok) { say(out, "error", await answerError(resp)); return; }
    const name = "recorder-" + start + ".trace.json";
    save(blob, name);
    say(out, "ok", "Downloaded " + name + " (" + bytes(blob.size) + "): open it in ui.perfetto.dev.");
  }
  async function takeStacks(button) {
    const out = document.getElementById("stacks-out"), box = document.getElementById("stacks");
    say(out, null, "Asking every process…");
    button.disabled = true;
    try {
      const resp = await fetchBusy("/stacks");
      if (!resp.ok) { say(out, "error", await answerError(resp)); return; }
      const answer = await resp.json();
      drawStacks(box, answer);
      say(out, "ok", answer.taken_ns ? "Taken at " + clock(answer.taken_ns) + " UTC." : "No process gave its stacks.");
    } catch (err) {
      say(out, "error", "The sidecar did not answer: " + err);
    } finally {
      button.disabled = false;
    }
  }
  function drawStacks(box, answer) {  // per process, one folded <details> per thread (the step thread open), innermost frame first
    box.replaceChildren();
    for (const p of answer.processes || []) {
      const part = make("div", {class: "stacks-process"});
      part.append(make("h4", {}, (p.process && p.process.label) || "process"));
      if (p.error) part.append(make("p", {class: "error"}, p.error));
      for (const t of p.threads || []) {
        const frames = (t.frames || []).slice().reverse();
        const details = make("details", {class: t.step_thread ? "thread step-thread" : "thread"});
        details.open = Boolean(t.step_thread);
        details.append(make("summary", {}, (t.name === null || t.name === undefined ? "thread " + t.id : t.name) +
          (t.step_thread ? " (step thread)" : "") + " · " + frames.length + " frames" + (frames.length ? " · in " + frames[0].function : "")));
        const list = make("ol", {class: "frames"});
        for (const f of frames) list.append(make("li", {}, f.function + " (" + f.file + ":" + f.line + ")"));
        if (t.truncated) list.append(make("li", {class: "muted"}, "… outer frames not shown"));
        details.append(list);
        part.append(details);
      }
      box.append(part);
    }
  }"""
