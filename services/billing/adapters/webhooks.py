"""The webhook caller (aiohttp client): one signed POST, its outcome as a status or an error, never an exception.

Redirects are not followed (a 3xx is a failed call: the URL registered is the one called); only http and https
URLs are called (domain.budgets.callable_url). The body is sent exactly as signed.

A tenant names the URL, and the call leaves from inside the provider's network, so by default only public
addresses are called (``ipaddress``'s ``is_global``): a host that resolves to a loopback, private, link-local
(cloud metadata at 169.254.169.254), shared or reserved address is refused, checked on the addresses the
connection is actually made to (a resolver that filters them, so a name that re-resolves to an internal address
between a check and the call gains nothing). ``allow_private`` (TESSERA_BILLING_WEBHOOK_ALLOW_PRIVATE) lifts
this, for a lab or a test whose receiver runs on the same host."""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver

from ..domain.budgets import SIGNATURE_HEADER, callable_url, sign


@dataclass(frozen=True)
class CallOutcome:
    status: int | None          # the HTTP status answered, None when there was no answer
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class NotPublic(OSError):
    """The webhook's host is, or resolves to, an address that is not public."""


def _refused(host: str, address: str) -> NotPublic | None:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return NotPublic(f"{host}: not an IP address: {address!r}")
    if not ip.is_global:
        return NotPublic(f"{host} is {ip}, not a public address: refused (TESSERA_BILLING_WEBHOOK_ALLOW_PRIVATE)")
    return None


class PublicOnlyResolver(AbstractResolver):
    """Resolves like aiohttp's threaded resolver, and refuses a host when any of its addresses is not public."""

    def __init__(self):
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET):
        found = await self._inner.resolve(host, port, family)
        for info in found:
            if (problem := _refused(host, info["host"])) is not None:
                raise problem
        return found

    async def close(self) -> None:
        await self._inner.close()


class WebhookCaller:
    """Calls webhooks over one aiohttp session (open it with ``async with``)."""

    def __init__(self, timeout_s: float, *, allow_private: bool = False):
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.allow_private = allow_private
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> WebhookCaller:
        connector = None if self.allow_private else aiohttp.TCPConnector(resolver=PublicOnlyResolver())
        self.session = aiohttp.ClientSession(timeout=self.timeout, connector=connector)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.session is not None:
            await self.session.close()

    async def post(self, url: str, body: bytes, *, secret: str | None, event: str, delivery_id: str,
                   t: int) -> CallOutcome:
        """POST ``body`` to ``url``, signed with ``secret`` at unix time ``t`` (unsigned without a secret)."""
        if not callable_url(url):
            return CallOutcome(None, "only http and https URLs are called")
        host = urlsplit(url).hostname or ""
        if not self.allow_private and _literal(host) and (problem := _refused(host, host)) is not None:
            return CallOutcome(None, str(problem))     # an IP literal is never resolved, so check it here
        headers = {"Content-Type": "application/json", "Tessera-Event": event, "Tessera-Delivery": delivery_id,
                   "User-Agent": "Tessera-Webhooks/1"}
        if secret:
            headers[SIGNATURE_HEADER] = sign(secret, body, t)
        try:
            async with self.session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
                await resp.read()
                return CallOutcome(resp.status, None if 200 <= resp.status < 300 else f"HTTP {resp.status}")
        except TimeoutError:
            return CallOutcome(None, f"timed out after {self.timeout.total}s")
        except NotPublic as exc:
            return CallOutcome(None, str(exc)[:500])
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, NotPublic):
                return CallOutcome(None, str(exc.os_error)[:500])
            return CallOutcome(None, f"{type(exc).__name__}: {exc}"[:500])
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return CallOutcome(None, f"{type(exc).__name__}: {exc}"[:500])


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
