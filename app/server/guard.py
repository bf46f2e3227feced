"""Who may talk to the app: one ASGI middleware in front of every route (the UI, Gradio's API and queue, its files
and ``/v1``), checked before any of them runs.

- **Host allow-list** (DNS rebinding): a page whose domain is rebound to 127.0.0.1 is same-origin with the app, but
  its requests still name its own domain in ``Host``. Only loopback names with the bound port pass, plus, with
  ``--listen``, the machine's own addresses and names and the ``--allow-host`` names (a reverse proxy's, any port).
- **Foreign origins** (cross-site requests): a request whose ``Origin`` is not the app's own is refused (``--cors``
  origins are let through to ``/v1`` only); a write without ``Origin`` is judged by its ``Referer``. Requests from
  tools (curl, SDKs) send neither and pass.
- **One key for everything** when it guards the UI (``--listen``): a login page sets an HttpOnly, SameSite=Strict
  cookie; clients send ``Authorization: Bearer KEY`` (or ``X-Api-Key: KEY``, as Anthropic's do); ``/?key=KEY``
  (the URL printed at start) logs a browser in.
  On loopback a key guards ``/v1`` only, as before. The cookie lasts ``SESSION_SECONDS`` (a week) and is renewed
  on use once it is a day old, so a browser in use stays signed in and one left alone is signed out.
- **No framing** (clickjacking): every answer, the UI's and the API's, says no page may frame it
  (``X-Frame-Options: DENY`` and ``Content-Security-Policy: frame-ancestors 'none'``).
"""
from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import json
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote, urlencode, urlsplit

LOOPBACK = frozenset({"localhost", "127.0.0.1", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
API_PREFIX = "/v1"
LOGIN_PATH = "/login"
# A week: the key is typed once a week at most on a browser in daily use (renewed on use), while a cookie left on a
# machine nobody uses any more, or copied off it, stops working within a week (checked here, not only by the browser).
SESSION_SECONDS = 7 * 24 * 3600
RENEW_AFTER_SECONDS = 24 * 3600  # renewed at most once a day: not a Set-Cookie on every answer
FRAMING = ((b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"))


def machine_names() -> set[str]:
    """This machine's addresses (IPv6 in brackets, as they appear in a Host header) and names, for ``--listen``."""
    import psutil

    names = {socket.gethostname().lower()}  # no getfqdn(): it asks DNS, and nothing may leave the machine unasked
    names.add(socket.gethostname().lower().split(".")[0] + ".local")  # mDNS, as other machines on a LAN reach it
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET:
                names.add(a.address)
            elif a.family == socket.AF_INET6:
                names.add(f"[{a.address.split('%')[0].lower()}]")
    return names


def split_host(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` or ``[v6][:port]`` → (lower-case name, port or None); None when it is not a host."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        name += "]"
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    else:
        name, _, port = value.partition(":")
    if not name or (port and not (port.isascii() and port.isdigit() and int(port) <= 65535)):
        return None  # (isdigit alone takes '²', which int() refuses)
    return name, int(port) if port else None


@dataclass(frozen=True)
class Access:
    """The rules for one server: where it listens and who may use it."""

    port: int
    listen: bool = False
    key: str | None = None
    allow_hosts: frozenset[str] = frozenset()  # --allow-host: any port (behind a reverse proxy)
    cors: tuple[str, ...] = ()  # --cors: web pages allowed to call /v1
    names: frozenset[str] = field(default=LOOPBACK)  # names allowed with the bound port

    @classmethod
    def serving(cls, port: int, listen: bool, key: str | None = None, allow_hosts=(), cors=()) -> Access:
        names = LOOPBACK | (machine_names() if listen else set())
        return cls(port, listen, key or None, frozenset(h.lower() for h in allow_hosts),
                   tuple(o.rstrip("/") for o in cors), frozenset(names))

    # --- the checks -----------------------------------------------------------------------------------------
    def host_allowed(self, host: str) -> bool:
        parsed = split_host(host)
        if parsed is None:
            return False
        name, port = parsed
        if name in self.allow_hosts:
            return True
        return name in self.names and (port == self.port or (port is None and self.port == 80))

    def origin_allowed(self, origin: str, path: str) -> bool:
        origin = origin.rstrip("/")
        if path_under(path, API_PREFIX) and ("*" in self.cors or origin in self.cors):
            return True
        try:
            url = urlsplit(origin)
            port = url.port  # raises on a port that is not a number or over 65535
        except ValueError:  # "http://[::1", "http://127.0.0.1:PORT.evil.example", "http://127.0.0.1:99999"
            return False
        if url.scheme not in ("http", "https") or not url.hostname:
            return False  # "null" (a sandboxed frame, a file), or not a URL
        host = url.netloc.rpartition("@")[2]
        if port is None:  # the scheme's port is what the browser means
            host += ":443" if url.scheme == "https" else ":80"
        return self.host_allowed(host)

    def key_guards(self, path: str) -> bool:
        return bool(self.key) and (self.listen or path_under(path, API_PREFIX))

    @property
    def cookie_name(self) -> str:  # cookies ignore ports: two apps on one machine keep their own
        return f"specchat_{self.port}"

    def session_token(self, issued: int | None = None) -> str:
        """What the cookie holds: when it was issued and a MAC of that with the key (the key itself never sits in a
        cookie)."""
        issued = int(time.time()) if issued is None else issued
        mac = hmac.new(self.key.encode(), f"specchat browser session {issued}".encode(), hashlib.sha256).hexdigest()
        return f"{issued}.{mac}"

    def session_age(self, token: str) -> float | None:
        """Seconds since the cookie ``token`` was issued; None when it is not one of ours or has expired."""
        issued, _, _ = token.partition(".")
        if not self.key or not issued.isascii() or not issued.isdigit() or len(issued) > 12:
            return None
        age = time.time() - int(issued)
        expected = self.session_token(int(issued)).encode()
        if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), expected) or \
                not -60 <= age <= SESSION_SECONDS:  # a minute's slack for a clock set back
            return None
        return age

    def session_cookie(self) -> bytes:
        """A fresh cookie for this port, for ``SESSION_SECONDS``."""
        return (f"{self.cookie_name}={self.session_token()}; Max-Age={SESSION_SECONDS}; Path=/; HttpOnly; "
                "SameSite=Strict").encode()

    def key_matches(self, given: str) -> bool:
        return bool(self.key) and hmac.compare_digest(given.encode(), self.key.encode())

    def login_url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/" + (f"?{urlencode({'key': self.key})}" if self.key else "")


def path_under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


class Guard:
    """ASGI middleware applying an ``Access`` to every HTTP request and websocket of ``app``."""

    def __init__(self, app, access: Access):
        self.app, self.access = app, access

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        extra = list(FRAMING)  # added to every answer; a renewed cookie joins them below
        send = _adding(send, extra)
        a, path = self.access, scope.get("path", "/")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")  # a websocket is opened with a GET
        host = headers.get("host", "")
        if not a.host_allowed(host):
            return await refuse(scope, send, 403, f"Host {host!r} is not served here: open the app as "
                                                  f"http://127.0.0.1:{a.port}/ (or start it with --allow-host NAME).",
                                "forbidden_host")
        origin = headers.get("origin")
        if origin is None and (method not in SAFE_METHODS or scope["type"] == "websocket"):
            referer = headers.get("referer")
            origin = _origin_of(referer) if referer else None
        if origin is not None and not a.origin_allowed(origin, path):
            return await refuse(scope, send, 403, f"Cross-origin request from {origin} refused (a web page may not "
                                                  "use this app; for /v1 see --cors ORIGIN).", "forbidden_origin")
        if not a.key_guards(path) or self._authorised(headers):
            if self._renew(headers):
                extra.append((b"set-cookie", a.session_cookie()))
            return await self.app(scope, receive, send)
        if scope["type"] == "http" and method == "OPTIONS" and path_under(path, API_PREFIX):
            return await self.app(scope, receive, send)  # a CORS preflight carries no credentials
        if scope["type"] == "http" and path == LOGIN_PATH and method == "POST":
            return await self._login(receive, send)
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if scope["type"] == "http" and method == "GET" and a.key_matches(query.get("key", [""])[0]):
            rest = {k: v for k, v in query.items() if k != "key"}  # the key leaves the address bar
            back = quote(path, safe="/:@!$&'()*+,;=")  # a Location header is latin-1: the path may not be
            return await self._signed_in(send, back + (f"?{urlencode(rest, doseq=True)}" if rest else ""))
        if scope["type"] == "http" and method == "GET" and not path_under(path, API_PREFIX) \
                and "text/html" in headers.get("accept", ""):
            return await _respond(send, 401, login_page(), "text/html; charset=utf-8")
        if not headers.get("cookie", "").isascii():  # no cookie is (RFC 6265), ours least of all: a forged one
            return await refuse(scope, send, 403, "Malformed Cookie header (not ASCII): send 'Authorization: Bearer "
                                                  "<key>', or sign in again.", "malformed_cookie")
        return await refuse(scope, send, 401, "Missing or wrong API key: send 'Authorization: Bearer <key>' (the key "
                                              "printed when the app started).", "invalid_api_key")

    def _authorised(self, headers: dict) -> bool:
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and self.access.key_matches(auth[7:].strip()):
            return True
        if self.access.key_matches(headers.get("x-api-key", "").strip()):  # the key as Anthropic's clients send it
            return True
        return self._session_age(headers) is not None

    def _session_age(self, headers: dict) -> float | None:
        cookies = _cookies(headers.get("cookie", ""))
        return self.access.session_age(cookies.get(self.access.cookie_name, ""))

    def _renew(self, headers: dict) -> bool:
        """Whether this request's cookie is due to be renewed (used, and a day old or more)."""
        if not self.access.key or self.access.cookie_name not in headers.get("cookie", ""):
            return False
        age = self._session_age(headers)
        return age is not None and age >= RENEW_AFTER_SECONDS

    async def _login(self, receive, send):
        body = b""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > 64 * 1024:
                return await _respond(send, 413, "Too large.", "text/plain; charset=utf-8")
            if not msg.get("more_body"):
                break
        given = parse_qs(body.decode("utf-8", "replace")).get("key", [""])[0]
        if self.access.key_matches(given.strip()):
            return await self._signed_in(send, "/")
        return await _respond(send, 401, login_page("That key is not right."), "text/html; charset=utf-8")

    async def _signed_in(self, send, location: str):
        cookie = self.access.session_cookie()
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location.encode("latin-1")), (b"set-cookie", cookie),
                                (b"cache-control", b"no-store"), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def _adding(send, extra: list[tuple[bytes, bytes]]):
    """``send`` with ``extra`` headers added to the start of each response (X-Frame-Options only where the app has
    not said it itself)."""
    async def sending(message):
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            present = {k.lower() for k, _ in headers}
            # A second Content-Security-Policy only narrows the first; X-Frame-Options is said once.
            headers += [(k, v) for k, v in extra if k != b"x-frame-options" or k not in present]
            message = {**message, "headers": headers}
        return await send(message)
    return sending


def _origin_of(url: str) -> str:
    try:
        u = urlsplit(url)
    except ValueError:  # "http://[::1" and the like: no origin of this app
        return "null"
    return f"{u.scheme}://{u.netloc}" if u.scheme and u.netloc else "null"


def _cookies(header: str) -> dict[str, str]:
    out = {}
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            out.setdefault(name, value)
    return out


async def refuse(scope, send, status: int, message: str, code: str):
    """Refuse before the app sees the request: OpenAI's error shape on /v1, one line of text elsewhere; a
    websocket is closed before it opens."""
    if scope["type"] == "websocket":
        return await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
    if path_under(scope.get("path", "/"), API_PREFIX):
        kind = "authentication_error" if status == 401 else "invalid_request_error"  # (llama-server's type)
        body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
        return await _respond(send, status, body, "application/json")
    return await _respond(send, status, message + "\n", "text/plain; charset=utf-8")


async def _respond(send, status: int, text: str, content_type: str):
    body = text.encode("utf-8")
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store"), (b"x-frame-options", b"DENY")]
    if status == 401 and content_type.startswith("application/json"):
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def login_page(error: str = "") -> str:
    """The page a browser without the key gets: self-contained (no script, no font, nothing fetched)."""
    note = f'<p class="error" role="alert">{html.escape(error)}</p>' if error else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>SpecChat — sign in</title>
<style>
body {{ font-family: system-ui, sans-serif; display: grid; place-items: center; min-height: 90vh; margin: 0;
       background: #f6f7f9; color: #1f2328; }}
form {{ background: #fff; padding: 2rem; border-radius: 12px; box-shadow: 0 2px 12px #0002; width: min(26rem, 90vw); }}
h1 {{ font-size: 1.3rem; margin-top: 0; }}
input {{ width: 100%; box-sizing: border-box; padding: .6rem; font-size: 1rem; margin: .5rem 0 1rem; }}
button {{ padding: .6rem 1.2rem; font-size: 1rem; }}
.error {{ color: #b42318; }}
@media (prefers-color-scheme: dark) {{ body {{ background: #0d1117; color: #e6edf3; }}
  form {{ background: #161b22; }} }}
</style></head>
<body><form method="post" action="{LOGIN_PATH}">
<h1>SpecChat</h1>
<p>This SpecChat is shared on the network, so it asks for its key: the one printed where it was started
(or set in <code>SPECCHAT_API_KEY</code>).</p>
{note}
<label for="key">Key</label>
<input id="key" name="key" type="password" autocomplete="current-password" autofocus required>
<button type="submit">Sign in</button>
</form></body></html>
"""


def lan_address(names) -> str | None:
    """Of the names an ``Access`` allows, an address other machines can use to reach this one (for the printed URL
    under --listen)."""
    lan = sorted(n for n in names if _is_lan(n))
    return lan[0] if lan else None


def _is_lan(name: str) -> bool:
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    return ip.version == 4 and not ip.is_loopback and not ip.is_link_local
