"""The pages' one script: a few lines of plain JavaScript, inline, no library.

What it does, and only this: keeps the sidecar's token (when it has one) in this tab's sessionStorage,
never in a URL or a cookie; sends it on every request the page makes; starts a capture or a scan by
calling the JSON API as any client does (the API validates: its error is shown beside the form);
downloads a trace or JSON with the token when links alone cannot (and, on the prompt a browser sent to
``/recorder`` gets, the flight recorder's file when the user presses Download, never on arrival:
``fetchRecording``); refreshes the home page's live
section while a job runs; and draws the home page's last minutes (timeline_script.py, a part of this
one script: its functions share the helpers above and the event handlers below).
Without a token every link and form also works as plain HTML.

The pages' Content-Security-Policy allows this script by its hash and no other (``SCRIPT_HASH``).
"""

from __future__ import annotations

import base64
import hashlib

from .styles import CSS
from .timeline_script import TIMELINE_SCRIPT

SCRIPT = r"""
"use strict";
(function () {
  const KEY = "sidecar-token";
  const token = () => sessionStorage.getItem(KEY);
  function headers(extra) {
    const h = Object.assign({}, extra || {});
    if (token()) h["Authorization"] = "Bearer " + token();
    return h;
  }
  function say(out, kind, text) {  // the form's <output>: its layout classes stay
    if (!out) return;
    out.classList.remove("ok", "error");
    if (kind) out.classList.add(kind);
    out.textContent = text;
  }
  async function fetchPage() {
    const resp = await fetch(location.pathname, {headers: headers({"Accept": "text/html"}), cache: "no-store"});
    return new DOMParser().parseFromString(await resp.text(), "text/html");
  }
  async function unlock(out) {
    let doc;
    try {
      doc = await fetchPage();
    } catch (err) {
      say(out, "error", "The sidecar did not answer: " + err);
      return;
    }
    if (doc.body.hasAttribute("data-locked")) {  // the prompt again: the sidecar refused the token
      sessionStorage.removeItem(KEY);
      say(out, "error", "The sidecar refused this token.");
      return;
    }
    document.title = doc.title;
    document.body.replaceWith(document.adoptNode(doc.body));
    schedule();
    loadTimeline();
  }
  let timer = null;
  function schedule() {  // while a capture or scan runs, the live section follows it
    clearTimeout(timer);
    const live = document.getElementById("live");
    if (live && live.hasAttribute("data-active")) timer = setTimeout(refresh, 1500);
  }
  async function refresh() {
    const live = document.getElementById("live");
    if (!live) return;
    let doc;
    try {
      doc = await fetchPage();
    } catch (err) {  // the sidecar restarting, or the network: try again at the next beat
      timer = setTimeout(refresh, 3000);
      return;
    }
    if (doc.body.hasAttribute("data-locked")) {  // the token stopped working (a restarted sidecar?): ask again
      sessionStorage.removeItem(KEY);
      document.body.replaceWith(document.adoptNode(doc.body));
      return;
    }
    const fresh = doc.getElementById("live");
    if (fresh) live.replaceWith(document.adoptNode(fresh));
    schedule();
  }
  function fields(form) {
    const body = {};
    for (const el of form.elements) {
      if (!el.name || el.disabled) continue;
      el.removeAttribute("aria-invalid");
      if (el.type === "checkbox") {
        if (!el.checked) continue;
        body[el.name] = el.dataset.list ? (body[el.name] ? body[el.name] + "," : "") + el.value : "true";
      } else if (el.value.trim() !== "" && el.value !== el.dataset.omit) {
        body[el.name] = el.value.trim();
      }
    }
    return body;
  }
  async function post(url, body, out, form, verb) {
    say(out, null, "…");
    let resp, answer;
    try {
      resp = await fetch(url, {method: "POST", headers: headers({"Content-Type": "application/json"}),
                               body: JSON.stringify(body)});
      answer = await resp.json();
    } catch (err) {
      say(out, "error", "The sidecar did not answer: " + err);
      return;
    }
    if (!resp.ok) {
      say(out, "error", (answer.param ? answer.param + ": " : "") + answer.message);
      const field = form && answer.param && form.elements.namedItem(answer.param);
      if (field && field.setAttribute) field.setAttribute("aria-invalid", "true");
      return;
    }
    say(out, "ok", verb + " " + answer.id + " (" + answer.state + ")");
    refresh();
  }
  function save(blob, name) {  // a Blob handed to the browser as a file
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url; a.download = name;
    document.body.appendChild(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }
  async function download(link) {
    const resp = await fetch(link.getAttribute("href"), {headers: headers()});
    if (!resp.ok) { alert(link.textContent + ": " + resp.status + " " + resp.statusText); return; }
    save(await resp.blob(), link.getAttribute("download") || "download");
  }
  function bytes(n) {
    if (n < 1024) return n + " B";
    return n < 1048576 ? (n / 1024).toFixed(1) + " KiB" : (n / 1048576).toFixed(1) + " MiB";
  }
  function recordingName() {  // recorder-<start ms>.trace.json (format=trace) or .json
    const q = new URLSearchParams(location.search);
    let start = (q.get("start_ms") || "").replace(/[^0-9.]/g, "").slice(0, 24);
    if (!start) start = String(Math.round(Date.now() - 1000 * (Number(q.get("seconds")) || 120)));
    return "recorder-" + start + (q.get("format") === "trace" ? ".trace.json" : ".json");
  }
  async function fetchRecording(out) {  // the prompt of /recorder: this URL as JSON, saved as a file
    say(out, null, "Asking the flight recorder…");
    let resp, blob;
    try {
      resp = await fetch(location.pathname + location.search,
                         {headers: headers({"Accept": "application/json"}), cache: "no-store"});
      if (resp.ok) blob = await resp.blob();
    } catch (err) {
      say(out, "error", "The sidecar did not answer: " + err);
      return;
    }
    if (resp.status === 401) {  // the sidecar refused the token: ask again
      sessionStorage.removeItem(KEY);
      say(out, "error", "The sidecar refused this token.");
      return;
    }
    if (!resp.ok) {  // the API's JSON error (a 400 naming its parameter, 429 busy, 503 no probes)
      let text = resp.status + " " + resp.statusText;
      try {
        const answer = await resp.json();
        if (answer && answer.message) text = (answer.param ? answer.param + ": " : "") + answer.message;
      } catch (err) { /* not JSON: the status says it */ }
      say(out, "error", text);
      return;
    }
    const name = recordingName();
    save(blob, name);
    say(out, "ok", "Downloaded " + name + " (" + bytes(blob.size) + ").");
  }
""" + TIMELINE_SCRIPT + r"""
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "hidden") clearTimeout(timeline.timer);
    else loadTimeline();
  });
  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    if (form.id === "token-form") {
      ev.preventDefault();
      // On /recorder's prompt an empty field keeps the token this tab holds (the field is optional there).
      if (form.elements.token.value || !document.body.hasAttribute("data-download")) {
        sessionStorage.setItem(KEY, form.elements.token.value);
      }
      form.elements.token.value = "";
      if (document.body.hasAttribute("data-download")) fetchRecording(form.querySelector("output"));
      else unlock(form.querySelector("output"));
    } else if (form.dataset.api) {
      ev.preventDefault();
      post(form.dataset.api, fields(form), form.querySelector("output"), form, "Started");
    }
  });
  document.addEventListener("click", (ev) => {
    const link = ev.target.closest("a[data-download]");
    if (link && token()) { ev.preventDefault(); download(link); return; }
    const button = ev.target.closest("button[data-post]");
    if (button) { post(button.dataset.post, {}, document.getElementById(button.dataset.out), null, "Stopped"); return; }
    const windowButton = ev.target.closest("button[data-window]");
    if (windowButton) {
      timeline.seconds = Number(windowButton.dataset.window);
      for (const b of document.querySelectorAll("button[data-window]")) b.setAttribute("aria-pressed", String(b === windowButton));
      loadTimeline();
      return;
    }
    const dot = ev.target.closest("[data-slow]");
    if (dot) { showStep(timeline.slow[Number(dot.getAttribute("data-slow"))]); return; }
    const stacksButton = ev.target.closest("#take-stacks");
    if (stacksButton) takeStacks(stacksButton);
  });
  document.addEventListener("keydown", (ev) => {  // a slow step's mark, reached with Tab
    const dot = ev.key === "Enter" && ev.target.closest && ev.target.closest("[data-slow]");
    if (dot) showStep(timeline.slow[Number(dot.getAttribute("data-slow"))]);
  });
  document.addEventListener("DOMContentLoaded", () => {
    const locked = document.body.hasAttribute("data-locked");
    if (locked && token() && document.body.hasAttribute("data-download")) {
      // Never on arrival: a link from another site must not set off a recorder dump in a tab that holds
      // the token. The user's click on Download does.
      const form = document.getElementById("token-form");
      form.elements.token.required = false;
      say(form.querySelector("output"), null, "This tab holds the sidecar's token: press Download (or enter another).");
    } else if (locked && token()) unlock(null);
    else { schedule(); loadTimeline(); }
  });
})();
"""


def csp_hash(text: str) -> str:
    """A CSP source that allows exactly this inline script or style."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


SCRIPT_HASH = csp_hash(SCRIPT)
STYLE_HASH = csp_hash(CSS)
