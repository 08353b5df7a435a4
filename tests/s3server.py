"""A real S3 endpoint for the tests: a moto server on 127.0.0.1 that can be stopped and restarted."""

import socket

import boto3

BUCKET = "rlcr-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """A real S3 endpoint (moto) that the test can stop and start again; its data survives restarts."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._cls = ThreadedMotoServer
        self.server = None

    def start(self):
        import logging

        # werkzeug binds a handler to whatever sys.stderr is at its first request log (a CLI runner's, closed when
        # that command returns): its own handler-less logger, quiet, before the first request
        quiet = logging.getLogger("werkzeug")
        quiet.setLevel(logging.WARNING)
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
        self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        if self.server is not None:  # idempotent: a retried task calls the hook again
            self.server.stop()
            self.server = None

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint)

    def keys(self, prefix=""):
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for p in pages for o in p.get("Contents", []))


class SlowProxy:
    """An HTTP proxy on 127.0.0.1 in front of an S3 endpoint that forwards every request at once but holds the
    response of the first ``times`` PUTs to a key ending in ``suffix`` (see :meth:`hold`) for ``delay_s`` seconds:
    a store whose request landed but whose answer came too late. ``puts[suffix]`` counts the PUTs forwarded."""

    def __init__(self, upstream: str):
        import http.server
        import threading

        proxy = self
        self.upstream = upstream.removeprefix("http://")
        self.rules: dict[str, list[float]] = {}  # suffix → [delay_s, responses still to hold]
        self.puts: dict[str, int] = {}
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                proxy._forward(self)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="slow-proxy", daemon=True).start()

    def hold(self, suffix: str, delay_s: float, times: int = 1) -> None:
        """Hold the response of the next ``times`` PUTs to a key ending in ``suffix`` for ``delay_s`` seconds."""
        with self.lock:
            self.rules[suffix] = [delay_s, times]
            self.puts.setdefault(suffix, 0)

    def _delay(self, method: str, path: str) -> float:
        key = path.split("?", 1)[0]
        with self.lock:
            for suffix, rule in self.rules.items():
                if method == "PUT" and key.endswith(suffix):
                    self.puts[suffix] += 1
                    if rule[1] > 0:
                        rule[1] -= 1
                        return rule[0]
        return 0.0

    def _forward(self, handler) -> None:
        import http.client
        import time

        if handler.headers.get("Transfer-Encoding"):
            raise NotImplementedError("SlowProxy forwards bodies with a Content-Length only")
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        headers = {k: v for k, v in handler.headers.items() if k.lower() != "connection"}  # Host is signed: kept
        upstream = http.client.HTTPConnection(self.upstream, timeout=30)
        try:
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            status, reason, reply_headers = response.status, response.reason, response.getheaders()
        finally:
            upstream.close()
        time.sleep(self._delay(handler.command, handler.path))  # the request has landed; its answer is late
        try:
            handler.send_response(status, reason)
            for name, value in reply_headers:
                if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                    handler.send_header(name, value)
            length = dict((k.lower(), v) for k, v in reply_headers).get("content-length", "0")
            handler.send_header("Content-Length", length if handler.command == "HEAD" else str(len(data)))
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(data)
        except OSError:  # the client gave up waiting and closed the connection
            handler.close_connection = True

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
