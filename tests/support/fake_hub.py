"""A small stand-in for the Hugging Face Hub on 127.0.0.1, speaking the endpoints huggingface_hub's downloads, model
search (``GET /api/models?search=&filter=gguf&sort=downloads&limit=&expand=``) and file listing
(``GET /api/models/{repo}/tree/{rev}?recursive=``) use.

It answers as the Hub does: ``HEAD/GET /{repo}/resolve/{rev}/{file}`` redirects LFS files to a content URL with
``X-Linked-Etag`` (the SHA-256), ``X-Linked-Size`` and ``X-Repo-Commit``; ``GET /lfs/{sha256}`` on a second port
(the CDN) serves bytes with HTTP Range; errors carry ``X-Error-Code`` (RepoNotFound, GatedRepo, EntryNotFound) with the Hub's status codes.
Tests select it with ``HF_ENDPOINT``. Knobs: private/gated repos, a new revision of a repo (files renamed upstream),
a per-request rate limit (so a test can kill a download halfway), corrupting the next response of a file, cutting or stalling the next responses of a file
halfway through (a dropped connection, a transfer that stops moving), and a log of every request.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, bytes]
    private: bool = False
    gated: bool = False  # readable only with a token in ``accepted`` (people who accepted the license)
    accepted: set[str] = field(default_factory=set)
    downloads: int = 0
    likes: int = 0
    gguf: dict | None = None  # the Hub's GGUF summary: architecture, total (parameters), context_length, ...
    commit: str = COMMIT  # the revision main points at: add the repo again with another to publish a new one


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    auth: str | None
    sent: int = 0


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)  # valid tokens; each may read every private/gated repo
    rate: int = 0  # bytes/s per response, 0 = unlimited
    corrupt_next: set[str] = field(default_factory=set)  # file names whose next body gets one flipped byte
    corrupt_always: set[str] = field(default_factory=set)  # ... and whose every body does
    cut: dict[str, int] = field(default_factory=dict)  # file name -> how many next bodies to drop halfway
    stall: dict[str, float] = field(default_factory=dict)  # file name -> seconds the next body halts halfway
    busy: dict[str, int] = field(default_factory=dict)  # file name -> how many next /resolve requests answer 503
    log: list[Request] = field(default_factory=list)

    def __post_init__(self):
        self._blobs: dict[str, bytes] = {}
        # Two origins, as on the real Hub: the API answers /resolve and redirects content to a "CDN" elsewhere.
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self)) for _ in range(2)]
        self.url, self.cdn = (f"http://127.0.0.1:{s.server_address[1]}" for s in self._servers)
        for server in self._servers:
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def add(self, repo: str, files: dict[str, bytes], **kw) -> None:
        self.repos[repo] = Repo(dict(files), **kw)
        for data in files.values():
            self._blobs[hashlib.sha256(data).hexdigest()] = data

    def sha(self, repo: str, name: str) -> str:
        return hashlib.sha256(self.repos[repo].files[name]).hexdigest()

    def bytes_sent(self, name_or_sha: str) -> int:
        return sum(r.sent for r in self.log if r.path.endswith(name_or_sha))

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()


def child_env(hub_url: str, folder: Path, **extra: str) -> dict[str, str]:
    """The environment of a `specchat` child that talks to the stand-in Hub at ``hub_url``: none of the caller's
    HF_ settings, a fresh cache in ``folder``, and a log of its connections there (``net.log``, empty) for the
    tests' check that nothing went beyond 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub_url, HF_HUB_CACHE=str(folder / "hub"), SPECCHAT_NET_LOG=str(folder / "net.log"),
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1", **extra)
    (folder / "net.log").write_text("")
    return env


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self._serve(body=False)

        def do_GET(self):
            self._serve(body=True)

        def _serve(self, body: bool):
            h = self.headers
            req = Request(self.command, unquote(self.path), h.get("Range"), h.get("Authorization"))
            hub.log.append(req)
            url = urlsplit(req.path)
            parts = url.path.lstrip("/").split("/")
            if parts[:2] == ["api", "models"]:
                return self._api(parts[2:], parse_qs(url.query), body)
            if parts[0] == "lfs" and len(parts) == 2:
                return self._content(parts[1], req, body)
            if "resolve" in parts:
                i = parts.index("resolve")
                return self._resolve("/".join(parts[:i]), "/".join(parts[i + 2:]), body)
            self._error(404, "NotFound", "Not found")

        def _resolve(self, repo_id: str, name: str, body: bool):
            repo = hub.repos.get(repo_id)
            if hub.busy.get(name):
                hub.busy[name] -= 1
                return self._error(503, None, "Service Unavailable")
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            if token and token not in hub.tokens:
                return self._error(401, None, "Invalid credentials in Authorization header")
            if repo is None or (repo.private and not token):
                return self._error(401, "RepoNotFound", "Repository not found")
            if repo.gated and token not in repo.accepted:
                return self._error(403 if token else 401, "GatedRepo", "Access to model is restricted.")
            if name not in repo.files:
                return self._error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
            data = repo.files[name]
            sha = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            self.send_header("Location", f"{hub.cdn}/lfs/{sha}")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", '"not-the-content-hash"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _content(self, sha: str, req: Request, body: bool):
            data = hub._blobs.get(sha)
            if data is None:
                return self._error(404, None, "No such object")
            start, end = 0, len(data) - 1
            ranged = bool(req.range and req.range.startswith("bytes="))
            if ranged:
                first, _, last = req.range[6:].partition("-")
                start, end = int(first), min(int(last or end), end)
            chunk = data[start:end + 1]
            names = {n for r in hub.repos.values() for n, d in r.files.items() if d is data}
            if body and names & (hub.corrupt_next | hub.corrupt_always) and chunk:
                hub.corrupt_next -= names
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            self.send_response(206 if ranged else 200)
            if ranged:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(len(chunk)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{sha}"')
            self.end_headers()
            if not body:
                return
            name = next((n for n in names if hub.cut.get(n) or n in hub.stall), None)
            halt = len(chunk) // 2 if name else None
            step = max(hub.rate // 20, 1) if hub.rate else len(chunk) or 1
            try:
                for i in range(0, len(chunk), step):
                    if halt is not None and i + step > halt:
                        self.wfile.write(chunk[i:halt])
                        req.sent += max(halt - i, 0)
                        self.wfile.flush()
                        return self._interrupt(name)
                    self.wfile.write(chunk[i:i + step])
                    req.sent += len(chunk[i:i + step])
                    if hub.rate:
                        threading.Event().wait(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _api(self, parts: list[str], query: dict, body: bool):
            """``/api/models`` (search) and ``/api/models/{owner}/{name}/tree/{rev}`` (file listing), in the Hub's
            JSON shapes (see huggingface_hub's ``ModelInfo`` and ``RepoFile``)."""
            if not parts:
                words = (query.get("search") or [""])[0].lower()
                wanted = set(query.get("filter", []))
                found = [(rid, r) for rid, r in hub.repos.items() if not r.private and not r.gated
                         and words in rid.lower()
                         and ("gguf" not in wanted or any(n.endswith(".gguf") for n in r.files))]
                if (query.get("sort") or [""])[0] == "downloads":
                    found.sort(key=lambda item: -item[1].downloads)
                found = found[:int((query.get("limit") or [1000])[0])]
                expand = set(query.get("expand", []))
                rows = []
                for rid, r in found:
                    row = {"_id": rid, "id": rid, "modelId": rid, "downloads": r.downloads, "likes": r.likes}
                    if "gguf" in expand and r.gguf:
                        row["gguf"] = r.gguf
                    rows.append(row)
                return self._json(rows, body)
            if len(parts) >= 4 and parts[2] == "tree":
                repo = hub.repos.get("/".join(parts[:2]))
                if repo is None or repo.private or repo.gated:
                    return self._error(401, "RepoNotFound", "Repository not found")
                rows = []
                for name, data in sorted(repo.files.items()):
                    sha = hashlib.sha256(data).hexdigest()
                    rows.append({"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data),
                                 "path": name, "lfs": {"oid": sha, "size": len(data), "pointerSize": 134}})
                return self._json(rows, body)
            self._error(404, None, "Not found")

        def _json(self, payload, body: bool):
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _interrupt(self, name: str):
            """Stall (hold the connection silent) or cut (close it) in the middle of a body."""
            if name in hub.stall:
                threading.Event().wait(hub.stall.pop(name))
            else:
                hub.cut[name] -= 1
            self.close_connection = True
            self.connection.shutdown(2)

        def _error(self, status: int, code: str | None, message: str, commit: str = ""):
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            payload = f'{{"error": "{message}"}}'.encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler
