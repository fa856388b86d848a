"""The CLI's client never sends the token through an HTTP proxy of the environment to a sidecar on this
host (issue 27, item 5): ``HTTP_PROXY`` is for the way out, and whoever runs the proxy would read the
bearer token of every ``sidecar capture``. A sidecar elsewhere is still reached the way the
environment says."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading

import pytest

from sidecar.cli.client import SidecarClient
from sidecar.service.app import make_app
from test_service import settings

TOKEN = "client-token-for-the-proxy-test"


class RecordingProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy that forwards nothing: it keeps each request line and its Authorization header,
    and answers 200 with a JSON body saying it was the proxy."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.seen.append((self.requestline, self.headers.get("Authorization")))
                body = json.dumps({"answered_by": "proxy"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def proxy(monkeypatch):
    server = RecordingProxy()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, server.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.shutdown()
    server.server_close()


async def test_a_loopback_sidecar_is_reached_directly_whatever_http_proxy_says(aiohttp_server, tmp_path, proxy):
    server = await aiohttp_server(make_app(settings(tmp_path, http_token=TOKEN)))
    for host in ("127.0.0.1", "localhost"):
        client = SidecarClient(f"http://{host}:{server.port}", token=TOKEN, timeout=10)
        # urllib blocks: off the loop that serves the app.
        answer = await asyncio.to_thread(client.request, "GET", "/processes")
        assert answer == {"processes": []}
        saved = await asyncio.to_thread(client.download, "/healthz", tmp_path / f"health-{host}.json")
        assert json.loads(saved.read_text())["status"] == "ok"
    assert proxy.seen == [], f"the proxy saw {proxy.seen}"


def test_a_sidecar_elsewhere_is_still_reached_through_the_proxy(proxy):
    client = SidecarClient("http://sidecar.invalid:8787", token=TOKEN, timeout=10)
    assert client.request("GET", "/processes") == {"answered_by": "proxy"}
    assert proxy.seen and proxy.seen[0][0].startswith("GET http://sidecar.invalid:8787/processes")


@pytest.mark.parametrize("host, direct", [
    ("127.0.0.1", True), ("localhost", True), ("localhost.", True), ("::1", True), ("[::1]", True),
    ("::ffff:127.0.0.1", True), ("0.0.0.0", True), ("::", True),  # `--host 0.0.0.0` prints the first
    ("10.0.0.5", False), ("sidecar.example", False), ("localhost.example", False),
])
def test_which_hosts_are_reached_without_a_proxy(host, direct):
    from sidecar.common import config

    assert config.reaches_this_machine(host) is direct
    # ...but only loopback counts as a loopback bind: 0.0.0.0 without a token is still refused.
    assert config.is_loopback_host(host) is (direct and host not in ("0.0.0.0", "::"))
