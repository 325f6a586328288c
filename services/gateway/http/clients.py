"""Who is calling, by address, behind the provider's proxies.

The token exchange's rate limit (per source address), the audit record's ``actor.ip`` and the access log all read
``request.remote``. Behind a load balancer or reverse proxy that is the proxy's address, shared by every client.
When the peer is one of ``TESSERA_TRUSTED_PROXIES`` (addresses or networks), the client is the right-most address of
``X-Forwarded-For`` that is not itself a trusted proxy (each proxy appends the address it received from, so the
addresses left of the first untrusted one could have been written by the client); the request goes on as a clone
with that ``remote``. From any other peer the header is ignored: a client cannot choose its own address.
"""
from __future__ import annotations

import functools
import ipaddress

from aiohttp import web

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@functools.lru_cache(maxsize=1024)   # pure; every request parses its peer's address (bounded: a header is the client's)
def _address(text: str):
    try:
        return ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None


def _trusted(address, proxies: tuple[Network, ...]) -> bool:
    return address is not None and any(address.version == n.version and address in n for n in proxies)


def client_address(remote: str | None, forwarded_for: list[str], proxies: tuple[Network, ...]) -> str | None:
    """The client's address: ``remote`` unless it is a trusted proxy, then the right-most untrusted hop of
    ``X-Forwarded-For`` (every header line, in order). Pure."""
    if not proxies or not _trusted(_address(remote or ""), proxies):
        return remote
    hops = [h for line in forwarded_for for h in line.split(",") if h.strip()]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:          # not an address: nothing further left can be believed
            return remote
        if not _trusted(address, proxies):
            return str(address)
    return str(_address(hops[0])) if hops else remote


def client_address_middleware(proxies: tuple[Network, ...]):
    @web.middleware
    async def behind_proxies(request: web.Request, handler) -> web.StreamResponse:
        client = client_address(request.remote, request.headers.getall("X-Forwarded-For", []), proxies)
        if client != request.remote:
            request = request.clone(remote=client)
        return await handler(request)

    return behind_proxies
