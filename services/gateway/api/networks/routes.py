"""Tenant networks (tenant members): create, list, read, delete; security rules; attachments.

Writes are accepted with 202 and travel to the network service as commands through the
outbox; the read model shows 'creating'/'adding' until the service answers (with the new
state, or 'rejected' and its reason). Another tenant's network, or a malformed id, is a
404, never a 403. Subnet and rule shapes are checked with the network service's own pure
rules (``cidr_problem`` and ``rule_problems`` of services.network.contracts), so a bad body
is a 422 and nothing is sent; so is a public subnet unless the provider allows them
(TESSERA_NETWORKS_ALLOW_PUBLIC_SUBNETS).
"""
from __future__ import annotations

import ipaddress
import uuid

import asyncpg
from aiohttp import web

from services.network.contracts import (
    AddSecurityRule,
    CreateNetwork,
    DeleteNetwork,
    RemoveSecurityRule,
    SecurityRule,
    is_private,
    rule_problems,
)

from ...adapters.audit_state import StateReader, ids, select_object
from ...http.auth import require_tenant_member
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, read_body
from ...http.problems import ProblemError, not_found, validation_problem
from ...http.schema_base import FieldError
from ...http.state import gateway_of
from . import views as repo
from .schemas import AttachmentList, AttachmentOut, NetworkCreate, NetworkList, NetworkOut, RuleCreate, RuleOut


def network_out(row: asyncpg.Record, rules: list[asyncpg.Record]) -> NetworkOut:
    return NetworkOut(**dict(row), rules=[RuleOut(**dict(r)) for r in rules if r["network_id"] == row["id"]],
                      links={"self": f"/v1/networks/{row['id']}", "attachments": f"/v1/networks/{row['id']}/attachments"})


async def _network(conn: asyncpg.Connection, request: web.Request, tenant_id: uuid.UUID, *,
                   for_update: bool = False) -> asyncpg.Record:
    row = await repo.get(conn, path_uuid(request, "network_id", "network"), tenant_id, for_update=for_update)
    if row is None:
        raise not_found("network")
    return row


async def create_network(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    body = await read_body(request, NetworkCreate)
    gw, network_id = gateway_of(request), uuid.uuid4()
    if not gw.config.allow_public_subnets and not is_private(ipaddress.IPv4Network(body.cidr)):
        raise validation_problem([FieldError(
            field="cidr", code="cidr", message=f"{body.cidr} is a public range: this provider allows private "
                                               "subnets only (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10)")])
    async with gw.unit_of_work("gateway.create_network") as uow:
        conn = uow.conn
        clash = await repo.overlapping(conn, p.tenant_id, body.cidr)
        if clash is not None:   # like a taken name, a conflict with the tenant's other networks (409)
            message = f"overlaps {clash['cidr']} of network {clash['name']!r}; a tenant's networks must not overlap"
            raise ProblemError(409, f"cidr {message}", slug="cidr-overlap",
                               errors=[FieldError(field="cidr", code="overlap", message=message)])
        row = await repo.request_network(conn, network_id, p.tenant_id, body.name, body.cidr, p.user_id)
        if row is None:
            raise ProblemError(409, f"a network named {body.name!r} already exists", slug="name-taken")
        await uow.emit("network.create_network", CreateNetwork(
            network_id=network_id, tenant_id=p.tenant_id, name=body.name, cidr=body.cidr),
            correlation_id=str(network_id), tenant_id=p.tenant_id)
    return respond(network_out(row, []), 202, headers={"Location": f"/v1/networks/{network_id}"})


async def list_networks(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.list_networks(conn, p.tenant_id)
        rules = await repo.rules_of(conn, [r["id"] for r in rows])
    return respond(NetworkList(items=[network_out(r, rules) for r in rows]))


async def get_network(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    async with gateway_of(request).pool.acquire() as conn:
        row = await _network(conn, request, p.tenant_id)
        rules = await repo.rules_of(conn, [row["id"]])
    return respond(network_out(row, rules))


async def delete_network(request: web.Request) -> web.Response:
    """202 and one delete_network for an active network; 202 again (nothing sent) once deleting."""
    p = require_tenant_member(request)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.delete_network") as uow:
        conn = uow.conn
        row = await _network(conn, request, p.tenant_id, for_update=True)
        if row["state"] in ("creating", "rejected"):
            raise ProblemError(409, f"the network is {row['state']}; only an active network can be deleted",
                               slug="network-not-active")
        if row["state"] == "active":
            if await repo.attachments_of(conn, row["id"]):
                raise ProblemError(409, "the network still has attachments; release their allocations first",
                                   slug="network-in-use")
            row = await repo.set_state(conn, row["id"], "deleting")
            await uow.emit("network.delete_network", DeleteNetwork(network_id=row["id"], tenant_id=p.tenant_id),
                           correlation_id=str(row["id"]), tenant_id=p.tenant_id)
        rules = await repo.rules_of(conn, [row["id"]])
    return respond(network_out(row, rules), 202)


def _rule_problem(problems: list[tuple[str, str]]) -> ProblemError:
    return validation_problem([FieldError(field=f, message=m, code="rule") for f, m in problems])


async def _check_remote(conn: asyncpg.Connection, tenant_id: uuid.UUID, network_id: uuid.UUID, body: RuleCreate) -> None:
    """The remote network of an ingress rule is another live network of the tenant (422 otherwise)."""
    remote = body.remote_network_id
    if remote is None:
        return
    row = await repo.get(conn, remote, tenant_id)
    if row is None or row["state"] not in ("creating", "active"):
        raise _rule_problem([("remote_network_id", "no such network")])   # another tenant's: the same answer
    if remote == network_id:
        raise _rule_problem([("remote_network_id", "traffic within a network is always allowed; name another network")])


async def add_rule(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    body = await read_body(request, RuleCreate)
    # the rule's shape first, whatever the network: a malformed rule is a 422 before any lookup
    problems = rule_problems(body.direction, body.protocol, body.port_from, body.port_to, body.remote_network_id,
                             body.remote_cidr)
    if problems:
        raise _rule_problem(problems)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.add_rule") as uow:
        conn = uow.conn
        net = await _network(conn, request, p.tenant_id, for_update=True)
        if net["state"] != "active":
            raise ProblemError(409, f"the network is {net['state']}; rules can be added to an active network",
                               slug="network-not-active")
        await _check_remote(conn, p.tenant_id, net["id"], body)
        rule = SecurityRule(id=uuid.uuid4(), **body.model_dump())
        row = await repo.request_rule(conn, p.tenant_id, net["id"], rule.model_dump())
        await uow.emit("network.add_security_rule", AddSecurityRule(
            network_id=net["id"], tenant_id=p.tenant_id, rule=rule), correlation_id=str(rule.id), tenant_id=p.tenant_id)
    return respond(RuleOut(**dict(row)), 202)


async def remove_rule(request: web.Request) -> web.Response:
    """202 and one remove_security_rule for an active rule; 202 again (nothing sent) while removing."""
    p = require_tenant_member(request)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.remove_rule") as uow:
        conn = uow.conn
        net = await _network(conn, request, p.tenant_id)
        row = await repo.get_rule(conn, path_uuid(request, "rule_id", "rule"), net["id"], p.tenant_id, for_update=True)
        if row is None or row["state"] == "rejected":
            raise not_found("rule")
        if row["state"] == "adding":
            raise ProblemError(409, "the rule is still being added; try again shortly", slug="rule-not-active")
        if row["state"] == "active":
            row = await repo.set_rule_state(conn, row["id"], "removing")
            await uow.emit("network.remove_security_rule", RemoveSecurityRule(
                network_id=net["id"], tenant_id=p.tenant_id, rule_id=row["id"]),
                correlation_id=str(row["id"]), tenant_id=p.tenant_id)
    return respond(RuleOut(**dict(row)), 202)


async def list_attachments(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    async with gateway_of(request).pool.acquire() as conn:
        net = await _network(conn, request, p.tenant_id)
        rows = await repo.attachments_of(conn, net["id"])
    return respond(AttachmentList(items=[AttachmentOut(**dict(r)) for r in rows]))


NETWORK_ID = Param("network_id", "path", "The network's id.", uuid.UUID, required=True)
RULE_ID = Param("rule_id", "path", "The rule's id.", uuid.UUID, required=True)
_BODY_ERRORS = (400, 401, 403, 404, 409, 413, 415, 422)

_NETWORK = StateReader(select_object("networks_view", "id = $1", "name", "state", "reason"), ids("network_id"))
_RULE = StateReader(select_object("network_rules_view", "id = $2 AND network_id = $1", "direction", "protocol",
                                  "port_from", "port_to", "remote_network_id", "remote_cidr", "state"),
                    ids("network_id", "rule_id"))


ENDPOINTS = [
    Endpoint("POST", "/v1/networks", create_network, "createNetwork", "Create a network of the tenant", "networks",
             {202: NetworkOut}, body=NetworkCreate, errors=(400, 401, 403, 409, 413, 415, 422),
             headers={202: {"Location": "The network (/v1/networks/{id})."}},
             description="Accepted as `creating`; the network service gives it a VNI, a gateway and a NAT address "
                         "(state `active`) or refuses it (state `rejected`, with the reason). A name the tenant "
                         "already uses, or a cidr overlapping one of its networks, is a 409. A cidr no host can use "
                         "(see its schema) is a 422, and so is a public one (outside 10.0.0.0/8, 172.16.0.0/12, "
                         "192.168.0.0/16 and 100.64.0.0/10) unless the provider allows public subnets "
                         "(TESSERA_NETWORKS_ALLOW_PUBLIC_SUBNETS)."),
    Endpoint("GET", "/v1/networks", list_networks, "listNetworks", "List the tenant's networks", "networks",
             {200: NetworkList}, errors=(401, 403)),
    Endpoint("GET", "/v1/networks/{network_id}", get_network, "getNetwork", "Read a network and its rules", "networks",
             {200: NetworkOut}, params=(NETWORK_ID,), errors=(401, 403, 404)),
    Endpoint("DELETE", "/v1/networks/{network_id}", delete_network, "deleteNetwork", "Delete a network without attachments",
             "networks", {202: NetworkOut}, params=(NETWORK_ID,), errors=(401, 403, 404, 409),
             audit_state=_NETWORK),
    Endpoint("POST", "/v1/networks/{network_id}/rules", add_rule, "addNetworkRule", "Add a security rule", "networks",
             {202: RuleOut}, body=RuleCreate, params=(NETWORK_ID,), errors=_BODY_ERRORS,
             description="Ingress from another network of the tenant, or egress to an outside CIDR. Accepted as "
                         "`adding`; then `active`, or `rejected` with the reason. Rules the schema cannot state: "
                         "`port_to` is not below `port_from` (the schema's `x-constraints`; a 422); an ingress "
                         "rule's `remote_network_id` is another network of the tenant, creating or active, not this "
                         "one (a 422); the network is active (a 409)."),
    Endpoint("DELETE", "/v1/networks/{network_id}/rules/{rule_id}", remove_rule, "removeNetworkRule",
             "Remove a security rule", "networks", {202: RuleOut}, params=(NETWORK_ID, RULE_ID), errors=(401, 403, 404, 409),
             audit_state=_RULE),
    Endpoint("GET", "/v1/networks/{network_id}/attachments", list_attachments, "listNetworkAttachments",
             "List the network's attachments (allocation, address, MAC, node)", "networks", {200: AttachmentList},
             params=(NETWORK_ID,), errors=(401, 403, 404)),
]
