"""With a token, a browser's navigation to a memory snapshot's page gets the token prompt (as the home
page and a capture's report do), not the JSON 401 an API client gets; no other path gains a prompt."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request

from sidecar.service.routes.pages import unauthorized_page

HTML = {"Accept": "text/html"}


def test_a_memory_page_without_the_token_is_the_prompt_for_a_browser():
    answer = unauthorized_page(make_mocked_request("GET", "/memory/g20261123-085748-53f178/page", headers=HTML))
    assert answer is not None and answer.status == 401 and answer.content_type == "text/html"
    assert "this memory snapshot&#x27;s page" in answer.text or "this memory snapshot's page" in answer.text
    assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"]


def test_the_json_of_a_memory_snapshot_and_an_api_client_keep_the_json_401():
    for path, headers in [("/memory/g20261123-085748-53f178", HTML),
                          ("/memory/g20261123-085748-53f178/page", {"Accept": "application/json"}),
                          ("/memory/g20261123-085748-53f178/files/x.pickle", HTML),
                          ("/memory/g20261123-085748-53f178/page/x", HTML)]:
        assert unauthorized_page(make_mocked_request("GET", path, headers=headers)) is None, path
