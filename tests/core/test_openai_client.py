"""Issue 48 point 8: the openai backend's HTTP client (httpx) reuses its connections, waits what a 429's
``Retry-After`` says, and does not retry a body that is not JSON; a local stdlib server records what it got."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from formtax.backends.openai_backend import ServerRefused, ServerUnavailable, _Client, retry_after


class _Server:
    def __init__(self, script):
        self.script, self.hits, self.ports = list(script), [], set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.hits.append(time.monotonic())
                outer.ports.add(self.client_address[1])
                status, headers, body = outer.script.pop(0) if outer.script else (200, {}, b'{"ok": true}')
                self.send_response(status)
                for k, v in {**headers, "content-length": str(len(body))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def http_stub():
    servers = []

    def make(script=()):
        servers.append(_Server(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_connections_are_reused(http_stub):
    s = http_stub()
    c = _Client(s.url, None, timeout=10, retries=0, backoff=0.01)
    for _ in range(10):
        assert c.request(s.url + "/completions", {"x": 1}) == {"ok": True}
    assert len(s.ports) == 1  # one connection for ten sequential requests (urllib opened one each)


def test_retry_after_is_honoured(http_stub):
    s = http_stub([(429, {"Retry-After": "0.6"}, b'{"error": {}}')])
    c = _Client(s.url, None, timeout=10, retries=2, backoff=0.01)
    assert c.request(s.url + "/completions", {"x": 1}) == {"ok": True}
    assert len(s.hits) == 2 and s.hits[1] - s.hits[0] >= 0.55  # the backoff alone would wait 0.01 s


def test_a_body_that_is_not_json_is_not_retried(http_stub):
    s = http_stub([(200, {}, b"<html>proxy error</html>")])
    c = _Client(s.url, None, timeout=10, retries=3, backoff=0.01)
    with pytest.raises(ServerRefused, match="not JSON"):
        c.request(s.url + "/completions", {"x": 1})
    assert len(s.hits) == 1


def test_refusals_and_exhausted_retries(http_stub):
    s = http_stub([(400, {}, json.dumps({"error": {"message": "bad"}}).encode())] + [(503, {}, b"{}")] * 3)
    c = _Client(s.url, None, timeout=10, retries=2, backoff=0.01)
    with pytest.raises(ServerRefused, match="400"):
        c.request(s.url + "/completions", {"x": 1})
    with pytest.raises(ServerUnavailable, match="3 tries"):
        c.request(s.url + "/completions", {"x": 1})


def test_retry_after_reads_seconds_and_dates():
    assert retry_after("2") == 2.0 and retry_after("-1") == 0.0 and retry_after("999") == 60.0
    assert retry_after(None) is None and retry_after("soon") is None
    assert 0 < retry_after(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))) <= 31
