"""The CLI's server-sent-event reader against a real socket: ending a watch (Ctrl-C, or the caller done with the
stream) returns at once, even while the server is silent between keepalives (the reader thread's blocked read is
woken, so closing the response does not wait for the server's next byte)."""
from __future__ import annotations

import asyncio
import http.client
import socket
import threading

from cli.api import _events

_EVENT = b"id: 7\ndata: {\"allocation_id\": \"a-1\"}\n\n"


def _silent_sse_server(stop: threading.Event) -> int:
    """A server that answers one stream with one event, then says nothing until ``stop``."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn, srv:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n" % (len(_EVENT), _EVENT))
            stop.wait(60)

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


async def test_closing_a_stream_the_server_keeps_silent_returns_at_once():
    stop = threading.Event()
    port = _silent_sse_server(stop)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("GET", "/v1/events")
        feed = _events(conn.getresponse(), conn, idle_s=5.0)
        assert next(feed) == ("7", None, '{"allocation_id": "a-1"}')
        await asyncio.wait_for(asyncio.to_thread(feed.close), 10)   # hung until the server's next byte before
    finally:
        stop.set()
