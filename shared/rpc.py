"""Request/reply over core NATS, for live reads that must not be stored (a console's tail): the contract's
messages of kind ``request`` (subject ``<service>.rpc.…``, outside every stream).

The owner answers (``Runtime.answer``, one queue group per service, so replicas share the load); a
requester sends with ``request``. Both sides check the catalog: only the owner answers, only the owner or
a service whose contract ``sends`` it asks. A request never changes state: nothing is retried, stored or
deduplicated; a requester that gets no answer says why (``RpcUnavailable``): nobody is subscribed
(``RpcNoResponders``, told by the server at once) or nobody answered in time (``RpcTimeout``). A handler's error is
returned to the requester as ``RpcError`` (header ``Tessera-Error``), never as a made-up reply.
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import structlog
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel, ValidationError

from .contract import Catalog, ContractViolation

ERROR_HEADER = "Tessera-Error"
log = structlog.get_logger()

Handler = Callable[[BaseModel], Awaitable[BaseModel]]


class RpcError(RuntimeError):
    """The owner answered with an error (str: its message)."""


class RpcUnavailable(RpcError):
    """Nobody answered: no responder is subscribed, or none answered within the timeout."""


class RpcNoResponders(RpcUnavailable):
    """No responder is subscribed: told by the server at once (the owner is not connected)."""


class RpcTimeout(RpcUnavailable):
    """A responder is subscribed but none answered within the timeout."""


async def serve(nc: Client, catalog: Catalog, service: str, type_: str, handler: Handler, **params: str):
    """Subscribe ``service`` (the owner) to answer ``type_`` on its subject rendered with ``params``; returns the
    subscription. Raises ContractViolation when ``service`` does not own ``type_`` or it is not a request."""
    msg = catalog.message(type_)
    if msg.kind != "request" or catalog.owner(type_).service != service:
        raise ContractViolation(f"{service} cannot answer {type_}: not a request it owns")

    async def answer(m) -> None:
        try:
            reply = await handler(msg.model.model_validate_json(m.data))
            await m.respond(reply.model_dump_json().encode())
        except ValidationError as exc:
            await nc.publish(m.reply, b"", headers={ERROR_HEADER: f"invalid request: {exc.errors()[0]['msg']}"[:500]})
        except Exception as exc:   # noqa: BLE001 -- the requester is told; nothing was changed
            log.warning("rpc.handler_failed", type=type_, error=repr(exc))
            await nc.publish(m.reply, b"", headers={ERROR_HEADER: str(exc)[:500] or type(exc).__name__})

    return await nc.subscribe(msg.render_subject(**params), queue=service, cb=answer)


async def request(nc: Client, catalog: Catalog, service: str, type_: str, payload: BaseModel, *,
                  timeout: float = 5.0, **params: str) -> BaseModel:
    """Ask the owner of ``type_`` and return its reply (the contract's reply model). Raises ContractViolation,
    RpcNoResponders (nobody is subscribed), RpcTimeout (no answer within ``timeout``) -- both RpcUnavailable --
    or RpcError (the owner's error).

    The server reports "no responders" only to a connection that announced headers and no_responders in its
    CONNECT (nats-py does when the server supports headers) and only for a new-style request (one shared reply
    subscription; ``old_style`` requests cannot see the status), which is what ``nc.request`` sends here."""
    msg = catalog.message(type_)
    if msg.kind != "request":
        raise ContractViolation(f"{type_} is not a request")
    subject = msg.render_subject(**params)
    catalog.check_send(service, type_, subject)
    msg.model.model_validate(payload.model_dump())
    try:
        answer = await nc.request(subject, payload.model_dump_json().encode(), timeout=timeout)
    except NoRespondersError:
        raise RpcNoResponders(f"{type_}: nobody answers on {subject}") from None
    except NatsTimeout:
        raise RpcTimeout(f"{type_}: no answer on {subject} within {timeout:g} s") from None
    if answer.headers and ERROR_HEADER in answer.headers:
        raise RpcError(answer.headers[ERROR_HEADER])
    try:
        return msg.reply.model_validate_json(answer.data)
    except ValidationError as exc:
        raise RpcError(f"{type_}: the answer does not match the contract: {json.dumps(exc.errors()[0]['msg'])}") from None
