"""A small synchronous client of the gateway on the standard library (http.client): bearer tokens from the
context's API key, re-exchanged shortly before they expire (or once when the server says 401), JSON in and
out, problem documents raised as ApiError, and server-sent event streams read line by line."""
from __future__ import annotations

import base64
import contextlib
import http.client
import json
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlencode, urlsplit

from cli.config import Context
from cli.errors import ApiError, CliError

REFRESH_MARGIN_S = 30.0     # a token is re-exchanged when it has less than this left


class Client:
    def __init__(self, ctx: Context, timeout: float = 30.0):
        self.ctx, self.timeout = ctx, timeout
        parts = urlsplit(ctx.url if "://" in ctx.url else f"http://{ctx.url}")
        self._https = parts.scheme == "https"
        self._host = parts.netloc
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    # -- transport
    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, timeout=timeout)

    def _send(self, conn, method: str, path: str, body: bytes | None, headers: dict) -> http.client.HTTPResponse:
        try:
            conn.request(method, self._prefix + path, body=body, headers=headers)
            return conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise CliError(f"cannot reach {self.ctx.url}: {exc}") from exc

    def _exchange(self, method: str, path: str, body: bytes | None, headers: dict) -> tuple[int, bytes, dict]:
        """One request on the kept-alive connection (one retry on a fresh one if the server had closed it)."""
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = self._connect(self.timeout)
            try:
                self._conn.request(method, self._prefix + path, body=body, headers=headers)
                resp = self._conn.getresponse()
                return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._conn.close()
                self._conn = None
                if attempt:
                    raise CliError(f"cannot reach {self.ctx.url}: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self._conn.close()
                self._conn = None
                raise CliError(f"cannot reach {self.ctx.url}: {exc}") from exc
        raise AssertionError("unreachable")

    # -- auth
    def token(self, force: bool = False) -> str:
        ctx = self.ctx
        if not force and ctx.token and ctx.token_expires_at - time.time() > REFRESH_MARGIN_S:
            return ctx.token
        status, raw, _ = self._exchange("POST", "/v1/auth/token", None, {"Authorization": f"ApiKey {ctx.api_key}"})
        body = _decode(raw)
        if status != 200:
            raise ApiError(status, body)
        ctx.remember_token(body["access_token"], time.time() + float(body.get("expires_in") or 60))
        return body["access_token"]

    def claims(self) -> dict:
        """The token's claims as the server wrote them (not verified here: only to know our tenant and role)."""
        payload = self.token().split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))

    def tenant_id(self, explicit: str | None = None) -> str:
        tid = explicit or self.claims().get("tid")
        if not tid:
            raise CliError("this key belongs to no tenant: pass --tenant", 2)
        return tid

    # -- requests
    def request(self, method: str, path: str, body: object = None, query: dict | None = None,
                headers: dict | None = None, expect: tuple[int, ...] = (200, 201, 202, 204), raw: bool = False) -> object:
        """The decoded JSON answer (text when it is not JSON; None when empty; the bytes with ``raw``); ApiError
        for another status."""
        if query:
            pairs = [(k, v) for k, v in query.items() if v is not None]
            path += ("&" if "?" in path else "?") + urlencode(pairs, doseq=True) if pairs else ""
        data = json.dumps(body).encode() if body is not None else None
        h = {"Accept": "application/json", **(headers or {})}
        if data is not None:
            h["Content-Type"] = "application/json"
        if method == "POST" and path.split("?")[0] == "/v1/allocations":
            h.setdefault("Idempotency-Key", str(uuid.uuid4()))
        for force in (False, True):
            h["Authorization"] = f"Bearer {self.token(force)}"
            status, body_bytes, _ = self._exchange(method, path, data, h)
            if status != 401 or force:
                break
        decoded = _decode(body_bytes)
        if status not in expect:
            raise ApiError(status, decoded)
        return body_bytes if raw else decoded

    def get(self, path: str, **query) -> object:
        return self.request("GET", path, query=query or None)

    def text(self, path: str, query: dict | None = None) -> str:
        """A non-JSON read (the console, an invoice's HTML) as text; ApiError unless 200."""
        return _as_text(self.request("GET", path, query=query, headers={"Accept": "*/*"}, expect=(200,), raw=True))

    def lines(self, path: str, query: dict | None = None) -> Iterator[str]:
        """A text response that stays open (a console followed), line by line, until the server ends it."""
        resp, conn = self._open(path, query, {"Accept": "text/plain"})
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_read_lines, args=(resp, lines), daemon=True).start()
        try:
            while raw := lines.get():
                yield raw.decode("utf-8", "replace")
        finally:
            conn.close()

    def items(self, path: str, **query) -> list[dict]:
        """Every item of a list answer, following ``next_cursor`` pages."""
        out, cursor = [], None
        while True:
            page = self.get(path, **query, **({"cursor": cursor} if cursor else {}))
            if isinstance(page, list):
                return page
            out.extend(page.get("items") or [])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def _open(self, path: str, query: dict | None, headers: dict):
        """A streamed GET on a connection of its own (no timeout: the reader thread blocks); ApiError unless 200."""
        if query:
            path += "?" + urlencode([(k, v) for k, v in query.items() if v is not None], doseq=True)
        conn = self._connect(None)
        resp = self._send(conn, "GET", path, None, {**headers, "Authorization": f"Bearer {self.token()}"})
        if resp.status != 200:
            body = resp.read()
            conn.close()
            raise ApiError(resp.status, _decode(body))
        return resp, conn

    def events(self, path: str, last_event_id: str | None = None, idle_s: float = 5.0,
               query: dict | None = None) -> Iterator[tuple[str | None, str | None, str] | None]:
        """Server-sent events of ``path`` as (id, event, data); None after ``idle_s`` without a byte (the caller
        may look around and keep reading). The stream is open when this returns (what the server commits from then
        on comes through it); ApiError when it does not open; the iterator ends when the server ends it."""
        resp, conn = self._open(path, query, {"Accept": "text/event-stream",
                                              **({"Last-Event-ID": last_event_id} if last_event_id else {})})
        return _events(resp, conn, idle_s)


def _events(resp, conn, idle_s: float) -> Iterator[tuple[str | None, str | None, str] | None]:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(resp, lines), daemon=True).start()
    try:
        yield from _parse_sse(lines, idle_s)
    finally:
        _wake_reader(resp)
        conn.close()


def _wake_reader(resp) -> None:
    """Shut the stream's socket down, so the reader thread's blocked read returns at once: closing the response
    waits for that read to let go of its buffer, which would otherwise be the server's next byte (a keepalive,
    seconds away), and Ctrl-C on a watch would hang until then."""
    sock = getattr(getattr(resp.fp, "raw", None), "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _as_text(raw: object) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")


def _read_lines(resp, lines: queue.Queue) -> None:
    """Blocking reads on a thread of their own, so the reader can wait with a timeout without breaking the
    stream (a socket read that timed out cannot be resumed). The stream closed under it (the watch ended: the
    response's file is gone, AttributeError) ends it like the server's end does."""
    try:
        while raw := resp.readline():
            lines.put(raw)
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        pass
    lines.put(b"")


def _parse_sse(lines: queue.Queue, idle_s: float) -> Iterator[tuple[str | None, str | None, str] | None]:
    event_id = event = None
    data: list[str] = []
    while True:
        try:
            raw = lines.get(timeout=idle_s)
        except queue.Empty:
            yield None
            continue
        if not raw:
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield event_id, event, "\n".join(data)
            event, data = None, []
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "data":
                data.append(value)
            elif key == "id":
                event_id = value
            elif key == "event":
                event = value


def _decode(raw: bytes) -> object:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
