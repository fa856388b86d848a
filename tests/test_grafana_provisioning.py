"""Grafana's provisioned data sources (deploy/grafana/provisioning/datasources/datasources.yaml), checked
without a Grafana: the exemplar link from Prometheus to Jaeger, and the Jaeger span links to the sidecar
(correlations of type external), each link built here as Grafana builds it (the provisioning's own
environment-variable expansion, the regex transformation on the span's attributes, the link's
variables) and then opened against a real sidecar with a real capture and a real probe's recorder."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

import yaml

from sidecar.service.jobs.capture import capture_url
from test_service import engines, sidecar, wait_final, wait_processes  # noqa: F401 (fixtures and helpers)

ROOT = Path(__file__).resolve().parents[1]
DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/datasources.yaml"
DASHBOARD = ROOT / "dashboards/inference-sidecar.json"
HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}  # a browser's navigation
# Fields of the data frame Grafana's Jaeger data source makes of a trace (one row per span).
TRACE_FIELDS = {"traceID", "spanID", "parentSpanID", "operationName", "serviceName", "serviceTags", "startTime",
                "duration", "logs", "references", "tags", "warnings", "stackTraces"}
_ENV = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_LINK_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.]*)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def provisioned(env: dict[str, str]) -> dict:
    """The file as Grafana reads it: each string value's ``$NAME``/``${NAME}`` replaced by the
    environment's value (empty when unset), ``$$`` a literal ``$`` (pkg/services/provisioning/values)."""
    def expand(value):
        if isinstance(value, str):
            return "$".join(_ENV.sub(lambda m: env.get(m.group(1) or m.group(2), ""), part)
                            for part in value.split("$$"))
        if isinstance(value, list):
            return [expand(v) for v in value]
        if isinstance(value, dict):
            return {k: expand(v) for k, v in value.items()}
        return value

    return expand(yaml.safe_load(DATASOURCES.read_text()))


def by_uid(config: dict) -> dict[str, dict]:
    return {source["uid"]: source for source in config["datasources"]}


def span_link(correlation: dict, span: dict) -> str | None:
    """The link Grafana's trace view shows for this span, or None where it shows none: the regex
    transformations applied to the JSON of their field (an attribute list is matched as
    ``JSON.stringify`` writes it), the first group (else the whole match) bound to ``mapValue``; a
    link any of whose variables has no value is not shown."""
    config = correlation["config"]
    # The row's own fields are variables too (a span's startTime and duration, ms), as Grafana gives them.
    variables: dict[str, str] = {name: str(value) for name, value in span.items() if isinstance(value, (int, float))}
    for transformation in config.get("transformations", []):
        assert transformation["type"] == "regex"
        value = span[transformation.get("field", config["field"])]
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        match = re.search(transformation["expression"], text)
        if match:
            variables[transformation.get("mapValue") or transformation["field"]] = match.group(1) or match.group(0)
    url = config["target"]["url"]
    names = [a or b for a, b in _LINK_VARIABLE.findall(url)]
    if any(name not in variables for name in names):
        return None
    # Grafana may URI-encode a variable's value in a link: the values here are ones encoding leaves alone.
    assert all(quote(variables[name], safe="") == variables[name] for name in names)
    return _LINK_VARIABLE.sub(lambda m: variables[m.group(1) or m.group(2)], url)


def jaeger_span(attributes: dict[str, str]) -> dict:
    """One row of the trace frame, as Grafana's Jaeger data source makes it of Jaeger's API."""
    return {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "00f067aa0ba902b7", "parentSpanID": None,
            "operationName": "text_completion local", "serviceName": "vllm", "startTime": 1_732_811_111_234.5,
            "duration": 812.25, "serviceTags": [{"key": "service.name", "type": "string", "value": "vllm"}],
            "tags": [{"key": key, "type": "string", "value": value} for key, value in attributes.items()],
            "logs": [], "references": [], "warnings": None, "stackTraces": None}


def correlations(config: dict) -> dict[str, dict]:
    return {c["label"]: c for c in by_uid(config)["jaeger"]["correlations"]}


CAPTURE_LINK = "inference-sidecar: capture of this request"
RECORDER_LINK = "inference-sidecar: flight recorder over this span"


def test_prometheus_exemplars_link_their_trace_id_to_jaeger():
    sources = by_uid(provisioned({}))
    assert {s["type"] for s in sources.values()} == {"prometheus", "jaeger"}
    [destination] = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    # The label the sidecar's exemplars carry the trace id in (OpenMetrics, sidecar/telemetry/instruments.py).
    assert destination["name"] == "trace_id" and destination["datasourceUid"] == "jaeger"
    assert "url" not in destination, "an internal link, to the Jaeger data source"


def test_the_latency_panels_ask_for_exemplars():
    dashboard = json.loads(DASHBOARD.read_text())
    latency = {p["title"]: p for p in dashboard["panels"]
               if p.get("title") in ("Time to first token", "Time per output token", "End-to-end latency", "Queue time")}
    assert len(latency) == 4
    for title, panel in latency.items():
        assert panel["targets"] and all(t["exemplar"] is True for t in panel["targets"]), title


def test_the_correlations_are_valid_provisioning():
    """What Grafana's provisioning demands of a correlation (pkg/services/correlations): a label and
    a description (it reads both as strings), a config type, a field, a target; an external one has no
    target data source."""
    raw = yaml.safe_load(DATASOURCES.read_text())
    for correlation in by_uid(raw)["jaeger"]["correlations"]:
        assert isinstance(correlation["label"], str) and isinstance(correlation["description"], str)
        assert "targetUID" not in correlation and "transformations" not in correlation  # nested under config
        config = correlation["config"]
        assert config["type"] == "external" and config["field"] in TRACE_FIELDS
        assert config["target"]["url"].startswith("${SIDECAR_PUBLIC_URL}/")
        for transformation in config.get("transformations", []):
            assert transformation["type"] == "regex" and transformation["expression"]
            assert transformation["field"] in TRACE_FIELDS
            re.compile(transformation["expression"])
    # Unset, the sidecar's address would be empty and every link relative to Grafana: the compose file sets it.
    assert correlations(provisioned({}))[RECORDER_LINK]["config"]["target"]["url"] == \
        "/recorder?format=trace&start_ms=${startTime}&duration_ms=${duration}"


def test_a_captured_requests_span_links_to_its_capture_and_every_span_to_the_recorder():
    config = provisioned({"SIDECAR_PUBLIC_URL": "http://localhost:8787"})
    links = correlations(config)
    capture_id = "20261128-183155-a1b2c3"
    captured = jaeger_span({"gen_ai.operation.name": "text_completion", "sidecar.capture.id": capture_id,
                            "sidecar.capture.url": capture_url(capture_id), "gen_ai.request.model": "local"})
    plain = jaeger_span({"gen_ai.operation.name": "text_completion",
                         "sidecar.capture.skipped": "busy: capture 20261128-000000-ffffff is capturing"})
    assert span_link(links[CAPTURE_LINK], captured) == f"http://localhost:8787/profile/{capture_id}/report"
    assert span_link(links[CAPTURE_LINK], plain) is None, "no capture, no link to one"
    for span in (captured, plain):
        assert span_link(links[RECORDER_LINK], span) == \
            "http://localhost:8787/recorder?format=trace&start_ms=1732811111234.5&duration_ms=812.25"


async def test_the_links_open_the_sidecars_capture_page_and_recorder(sidecar, engines):
    """Built from the provisioning for a sidecar at its real address, each link answers there: the
    capture's report page (HTML, a capture of a real stand-in engine) and the recorder's trace."""
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    resp = await client.get("/profile/start", params={"steps": "2"})
    assert resp.status == 202, await resp.text()
    capture = await wait_final(client, (await resp.json())["id"])
    assert capture["state"] == "done", capture
    links = correlations(provisioned({"SIDECAR_PUBLIC_URL": client.url}))
    # The request span of a request captured by this capture carries its URL (sidecar/telemetry/requests.py).
    span = jaeger_span({"sidecar.capture.id": capture["id"], "sidecar.capture.url": capture_url(capture["id"])})
    # A span over the capture's steps (its processes' recorded window), in ms as the trace frame has them.
    span["startTime"], span["duration"] = (time.time() - 30) * 1000, 30_000.0

    page_url = span_link(links[CAPTURE_LINK], span)
    assert page_url.startswith(client.url + "/")
    page = await client.get(_path(page_url), headers=HTML)
    assert page.status == 200 and page.content_type == "text/html"
    assert capture["id"] in await page.text()

    recorder_url = span_link(links[RECORDER_LINK], span)
    assert recorder_url.startswith(client.url + "/")
    recorder = await client.get(_path(recorder_url))
    assert recorder.status == 200, await recorder.text()
    events = (await recorder.json())["traceEvents"]
    assert any(str(e.get("name", "")).startswith("step ") for e in events), "the engine's steps, on its track"
    # Only the span's range: the same span an hour earlier is out of the recorder's reach (a 400 naming
    # start_ms), and a range that ended before the engine started holds none of its steps.
    old = await client.get("/recorder", params={"format": "trace", "start_ms": str((time.time() - 7200) * 1000)})
    assert old.status == 400 and (await old.json())["param"] == "start_ms"
    before = await client.get("/recorder", params={"start_ms": str((time.time() - 3000) * 1000), "duration_ms": "1000"})
    assert before.status == 200 and all(not p["steps"] for p in (await before.json())["processes"])


def _path(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")
