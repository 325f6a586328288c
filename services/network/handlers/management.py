"""Tenant commands: create/delete networks, add/remove security rules.

Each runs under the tenant's lock and answers with exactly one result event: the new
state, or ``network.command_rejected`` with the reason (then nothing changed: the work runs
in a savepoint). A command that can never apply for a reason no rule here catches (data
PostgreSQL refuses) is rolled back by the consumer kit and refused at once the same way (``refused``).
Every change bumps the tenant's version and publishes all its networks
(``network.tenant_networks_changed``). Repeating a command (same network or rule id) is
answered like the first time and changes nothing.

Every handler reaches storage through the ``NetworkRepository`` port only; its ``repository`` keyword builds
one on the unit of work's connection (the asyncpg one unless told otherwise: the unit tests pass a fake).
"""
from __future__ import annotations

import uuid

from shared.refusals import Refusal, text_safe
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.repository import PgNetworkRepository
from ..domain.model import NetworkPlan
from ..domain.networks import Refused, owned, parse_cidr
from ..domain.ports import NetworkRepository
from ..domain.rules import check_rule
from .tenancy import RepositoryFactory, changed, find, provision_network, release_tenant_if_empty, snapshot


async def _reject(ctx: UnitOfWork, cmd, command: str, reason: str, rule_id: uuid.UUID | None = None) -> None:
    await ctx.emit("network.command_rejected", c.NetworkCommandRejected(
        tenant_id=cmd.tenant_id, command=command, network_id=cmd.network_id, rule_id=rule_id,
        reason=text_safe(reason, 2000)), tenant_id=cmd.tenant_id)


def _rule_id(cmd) -> uuid.UUID | None:
    return cmd.rule.id if isinstance(cmd, c.AddSecurityRule) else getattr(cmd, "rule_id", None)


def refused(command: str) -> Refusal:
    """The ``on_refused`` of a management command's subscription (``command``: its short name, as in
    ``NetworkCommandRejected``): the handler failed for a reason no retry can fix and changed nothing."""
    async def on_refused(ctx: UnitOfWork, cmd, reason: str) -> None:
        await _reject(ctx, cmd, command, reason, _rule_id(cmd))
    return on_refused


async def _created(ctx: UnitOfWork, networks: NetworkRepository, tenant_id: uuid.UUID, network_id: uuid.UUID, *,
                   bump: bool) -> None:
    tn = await (changed(ctx, networks, tenant_id) if bump else snapshot(networks, tenant_id))
    await ctx.emit("network.network_created", c.NetworkCreated(
        tenant_id=tenant_id, network=find(tn, network_id), version=tn.version), tenant_id=tenant_id)


async def create_network(ctx: UnitOfWork, cmd: c.CreateNetwork, *, plan: NetworkPlan,
                         repository: RepositoryFactory = PgNetworkRepository) -> None:
    """Create the network (VNI, NAT address; the tenant's VRF id, PKey and L3 VNI on its first)."""
    networks = repository(ctx.conn)
    await networks.lock_tenant(cmd.tenant_id)
    nets = await networks.networks_of(cmd.tenant_id)
    if any(n.id == cmd.network_id for n in nets):
        return await _created(ctx, networks, cmd.tenant_id, cmd.network_id, bump=False)
    if await networks.network_exists(cmd.network_id):   # another tenant's id: say nothing about it
        return await _reject(ctx, cmd, "create_network", "network id already in use; choose another")
    try:
        async with networks.savepoint():
            await provision_network(networks, plan, cmd.tenant_id, nets, cmd.network_id, cmd.name,
                                    parse_cidr(cmd.cidr))
    except Refused as exc:
        return await _reject(ctx, cmd, "create_network", exc.reason)
    await _created(ctx, networks, cmd.tenant_id, cmd.network_id, bump=True)


async def delete_network(ctx: UnitOfWork, cmd: c.DeleteNetwork, *,
                         repository: RepositoryFactory = PgNetworkRepository) -> None:
    """Delete a network without attachments, its rules and rules naming it; release its VNI and NAT
    address, and the tenant's VRF id, PKey and L3 VNI with its last network."""
    networks = repository(ctx.conn)
    await networks.lock_tenant(cmd.tenant_id)
    try:
        net = owned(cmd.network_id, await networks.networks_of(cmd.tenant_id))
    except Refused as exc:
        return await _reject(ctx, cmd, "delete_network", exc.reason)
    attached = await networks.count_attachments(net.id)
    if attached:
        return await _reject(ctx, cmd, "delete_network",
                             f"network {net.name!r} still has {attached} attachment(s); release them first")
    await networks.delete_network(net.id)
    await release_tenant_if_empty(networks, cmd.tenant_id)
    tn = await changed(ctx, networks, cmd.tenant_id)
    await ctx.emit("network.network_deleted", c.NetworkDeleted(tenant_id=cmd.tenant_id, network_id=net.id,
                                                               version=tn.version), tenant_id=cmd.tenant_id)


async def add_security_rule(ctx: UnitOfWork, cmd: c.AddSecurityRule, *,
                            repository: RepositoryFactory = PgNetworkRepository) -> None:
    """Add the rule (see domain.rules for what is refused)."""
    networks = repository(ctx.conn)
    await networks.lock_tenant(cmd.tenant_id)
    nets = await networks.networks_of(cmd.tenant_id)
    found = await networks.rule(cmd.rule.id)
    if found is not None:
        if found[0] == cmd.network_id and any(n.id == cmd.network_id for n in nets):   # a repeat
            tn = await snapshot(networks, cmd.tenant_id)
            return await ctx.emit("network.security_rule_added", c.SecurityRuleAdded(
                tenant_id=cmd.tenant_id, network_id=cmd.network_id, rule=found[1], version=tn.version),
                tenant_id=cmd.tenant_id)
        return await _reject(ctx, cmd, "add_security_rule", "rule id already in use; choose another", cmd.rule.id)
    existing = (await networks.rules_of([cmd.network_id]))[cmd.network_id]
    try:
        check_rule(cmd.network_id, cmd.rule, nets, existing)
    except Refused as exc:
        return await _reject(ctx, cmd, "add_security_rule", exc.reason, cmd.rule.id)
    await networks.add_rule(cmd.network_id, cmd.rule)
    tn = await changed(ctx, networks, cmd.tenant_id)
    await ctx.emit("network.security_rule_added", c.SecurityRuleAdded(
        tenant_id=cmd.tenant_id, network_id=cmd.network_id, rule=cmd.rule, version=tn.version), tenant_id=cmd.tenant_id)


async def remove_security_rule(ctx: UnitOfWork, cmd: c.RemoveSecurityRule, *,
                               repository: RepositoryFactory = PgNetworkRepository) -> None:
    """Remove the rule; a rule that is not there (any more) is answered as removed."""
    networks = repository(ctx.conn)
    await networks.lock_tenant(cmd.tenant_id)
    try:
        owned(cmd.network_id, await networks.networks_of(cmd.tenant_id))
    except Refused as exc:
        return await _reject(ctx, cmd, "remove_security_rule", exc.reason, cmd.rule_id)
    found = await networks.rule(cmd.rule_id)
    if found is not None and found[0] == cmd.network_id:
        await networks.delete_rule(cmd.rule_id)
        tn = await changed(ctx, networks, cmd.tenant_id)
    else:
        tn = await snapshot(networks, cmd.tenant_id)
    await ctx.emit("network.security_rule_removed", c.SecurityRuleRemoved(
        tenant_id=cmd.tenant_id, network_id=cmd.network_id, rule_id=cmd.rule_id, version=tn.version),
        tenant_id=cmd.tenant_id)
