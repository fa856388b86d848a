"""An OTLP/HTTP trace endpoint for tests (protobuf, as the OpenTelemetry SDK's exporter sends it): the spans
it receives are kept, decoded, for the test to read."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpReceiver:
    """An OTLP/HTTP trace endpoint (protobuf, as the OpenTelemetry SDK's exporter sends): spans kept."""

    def __init__(self) -> None:
        spans, lock = [], threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                export = ExportTraceServiceRequest.FromString(body)
                with lock:
                    for rs in export.resource_spans:
                        for ss in rs.scope_spans:
                            spans.extend(_span(s) for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.spans, self._lock = spans, lock
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.spans)

    def close(self) -> None:
        self._server.shutdown()


def _span(s) -> dict:
    def value(v):
        kind = v.WhichOneof("value")
        return [value(x) for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)

    return {"name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
            "parent_id": s.parent_span_id.hex() or None, "start_ns": s.start_time_unix_nano,
            "end_ns": s.end_time_unix_nano, "attributes": {a.key: value(a.value) for a in s.attributes},
            "events": [{"name": e.name, "attributes": {a.key: value(a.value) for a in e.attributes}} for e in s.events],
            "links": [{"span_id": link.span_id.hex(), "attributes": {a.key: value(a.value) for a in link.attributes}}
                      for link in s.links]}
