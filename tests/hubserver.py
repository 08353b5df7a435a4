"""A stand-in Hugging Face hub on 127.0.0.1: serves the files of local directories as model repos, answering the
endpoints ``huggingface_hub.snapshot_download`` calls (repo info, tree listing, HEAD and GET of ``resolve``)."""

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    """``repos``: ``{"org/name": directory}``; every repo has one commit, :data:`COMMIT`."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = {k: Path(v) for k, v in repos.items()}
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def _files(self, repo: str) -> dict[str, Path]:
        root = self.repos[repo]
        return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
                self.send_response(code)
                for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _route(self, head: bool):
                path = unquote(urlparse(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 6:
                    repo, what = "/".join(parts[2:4]), parts[4]
                    if repo not in hub.repos:
                        return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                    if what == "revision":
                        files = hub._files(repo)
                        doc = {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": n} for n in files]}
                    elif what == "tree":
                        doc = [{"type": "file", "path": n, "size": p.stat().st_size,
                                "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for n, p in hub._files(repo).items()]
                    else:
                        return self._send(404)
                    return self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, head)
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                    p = hub._files(repo).get(name) if repo in hub.repos else None
                    if p is None:
                        return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                    body = p.read_bytes()
                    etag = f'"{hashlib.sha256(body).hexdigest()}"'
                    return self._send(200, body, {"X-Repo-Commit": COMMIT, "ETag": etag}, head)
                return self._send(404, b"", {}, head)

            def do_GET(self):
                self._route(head=False)

            def do_HEAD(self):
                self._route(head=True)

        return Handler
