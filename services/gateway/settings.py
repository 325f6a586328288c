"""The gateway's own settings (the kit's ``ServiceSettings`` are read beside them), built once in bootstrap.

  TESSERA_TOKEN_SECRET         required, at least 32 characters: the HS256 key of access tokens
  TESSERA_TOKEN_TTL_S          [900]  seconds an access token lives
  TESSERA_TOKEN_KEY_ROTATE_S   [86400] seconds between automatic signing-key rotations (0: manual only)
  TESSERA_BOOTSTRAP_ADMIN_KEY  optional: the API key of the provider admin ``admin``
  TESSERA_CONSOLE_FOLLOW_MAX_S [3600] seconds a followed console stream lasts at most
  TESSERA_POWER_ACTION_TTL_S   [300]  seconds a power action may wait for its node: the command's deadline
  TESSERA_SECRET_KEY           optional: the platform's secret key (32 bytes, base64) that seals BMC passwords
  TESSERA_SECRET_KEY_FILE      optional: a file holding that key (read once, at start); without either, a BMC
                               cannot be registered (503)
  TESSERA_BMC_VALIDATE_TIMEOUT_S [45] seconds POST /v1/nodes/{id}/bmc/validate waits for the node-agent
  TESSERA_RATE_{TENANT,USER}_{READ,WRITE}_{PER_S,BURST}  API token buckets (docs/rate-limits.md): a tenant's
                               [read 500/s, burst 1000; write 200/s, burst 400], each of its users' [read 200/s,
                               burst 400; write 100/s, burst 200]; a rate of 0 is no limit
  TESSERA_RATE_TOKEN_PER_S / _BURST [50 / 200] token exchanges (POST /v1/auth/token) per source address
  TESSERA_SSE_PER_TENANT       [100] event streams a tenant may hold open at once, all replicas together (0: no limit)
  TESSERA_NETWORKS_ALLOW_PUBLIC_SUBNETS [0] 1: a tenant network may have a public subnet; 0: private ranges only
                               (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10); a range no host can use
                               (multicast, reserved, loopback, link-local, 0.0.0.0/8) is refused either way

A missing or short secret, a secret key that is not 32 bytes of base64 (or a key file that cannot be read), or a
TTL that is not a positive integer, raises SettingError naming the variable (no secret's value is ever repeated
in the message).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from shared.secrets import KEY_FILE_VAR, KEY_VAR, SecretError, key_from_env
from shared.settings import SettingError, flag, integer, number, setting

MIN_SECRET_CHARS = 32


def networks(raw: str) -> tuple:
    return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in raw.split(",") if part.strip())


networks.what = "a comma-separated list of addresses or networks (CIDR)"   # type: ignore[attr-defined]


@dataclass(frozen=True)
class GatewaySettings:
    token_secret: str = setting("TESSERA_TOKEN_SECRET", "",
                                doc=f"the HS256 key of access tokens (required, at least {MIN_SECRET_CHARS} characters)")
    token_ttl_s: int = setting("TESSERA_TOKEN_TTL_S", 900, integer(1), doc="seconds an access token lives")
    token_key_rotate_s: int = setting("TESSERA_TOKEN_KEY_ROTATE_S", 86400, integer(0),
                                      doc="seconds between automatic rotations of the token signing key (0: only "
                                          "POST /v1/ops/signing-keys/rotate); see docs/credentials.md")
    credentials_refresh_s: float = 5.0       # (not from the environment) revocation list's safety reload period
    bootstrap_admin_key: str | None = setting("TESSERA_BOOTSTRAP_ADMIN_KEY", None,
                                              doc="the API key of the provider admin `admin` (optional)")
    console_follow_max_s: int = setting("TESSERA_CONSOLE_FOLLOW_MAX_S", 3600, integer(1),
                                        doc="seconds a followed console stream (GET .../console?follow=true) lasts at most")
    power_action_ttl_s: int = setting("TESSERA_POWER_ACTION_TTL_S", 300, integer(1),
                                      doc="seconds a power action may wait for its node: the command's deadline "
                                          "(a node refuses it later; the gateway then fails the action)")
    secret_key: str | None = setting(KEY_VAR, None, doc="the platform's secret key (32 bytes, base64 urlsafe) that "
                                                        "seals BMC passwords (optional; see TESSERA_SECRET_KEY_FILE)")
    secret_key_file: str | None = setting(KEY_FILE_VAR, None, doc="a file holding the platform's secret key (read "
                                                                  "once, at start); without a key no BMC can be set")
    bmc_validate_timeout_s: float = setting("TESSERA_BMC_VALIDATE_TIMEOUT_S", 45.0, number(positive=True),
                                            doc="seconds a BMC validation waits for the node-agent's answer")
    # API rate limits (docs/rate-limits.md); the provider admins' per-tenant overrides replace the tenant and user ones
    rate_tenant_read_per_s: int = setting("TESSERA_RATE_TENANT_READ_PER_S", 500, integer(0),
                                          doc="reads a tenant may make a second, all its users together (0: no limit)")
    rate_tenant_read_burst: int = setting("TESSERA_RATE_TENANT_READ_BURST", 1000, integer(1),
                                          doc="reads a tenant may make at once after a pause (its bucket's size)")
    rate_tenant_write_per_s: int = setting("TESSERA_RATE_TENANT_WRITE_PER_S", 200, integer(0),
                                           doc="writes (POST, PUT, PATCH, DELETE) a tenant may make a second (0: no limit)")
    rate_tenant_write_burst: int = setting("TESSERA_RATE_TENANT_WRITE_BURST", 400, integer(1),
                                           doc="writes a tenant may make at once after a pause")
    rate_user_read_per_s: int = setting("TESSERA_RATE_USER_READ_PER_S", 200, integer(0),
                                        doc="reads one tenant member may make a second (0: no limit)")
    rate_user_read_burst: int = setting("TESSERA_RATE_USER_READ_BURST", 400, integer(1),
                                        doc="reads one tenant member may make at once after a pause")
    rate_user_write_per_s: int = setting("TESSERA_RATE_USER_WRITE_PER_S", 100, integer(0),
                                         doc="writes one tenant member may make a second (0: no limit)")
    rate_user_write_burst: int = setting("TESSERA_RATE_USER_WRITE_BURST", 200, integer(1),
                                         doc="writes one tenant member may make at once after a pause")
    rate_token_per_s: int = setting("TESSERA_RATE_TOKEN_PER_S", 50, integer(0),
                                    doc="token exchanges (POST /v1/auth/token) one source address may make a second "
                                        "(0: no limit)")
    rate_token_burst: int = setting("TESSERA_RATE_TOKEN_BURST", 200, integer(1),
                                    doc="token exchanges one source address may make at once after a pause")
    trusted_proxies: tuple = setting("TESSERA_TRUSTED_PROXIES", (), networks,
                                     doc="addresses or networks (CIDR) of the load balancers and proxies in front of "
                                         "the gateway, whose X-Forwarded-For names the client (rate limits per "
                                         "address, audit, access log); empty: the peer is the client")
    rate_hold_refusals: int = setting("TESSERA_RATE_HOLD_REFUSALS", 64, integer(0),
                                      doc="refusals of one tenant a replica holds until the refusing bucket has a "
                                          "token again (at most 1 s) before answering the 429, so a client that "
                                          "ignores Retry-After waits anyway; past that many, the 429 is at once "
                                          "(0: never hold); see docs/rate-limits.md")
    tenant_inflight: int = setting("TESSERA_GATEWAY_TENANT_INFLIGHT", 2, integer(0),
                                   doc="requests of one tenant a gateway replica works on at once (times the tenant's "
                                       "weight); the tenant's others wait for one of its own to end, so its many "
                                       "clients never delay another tenant's request (0: no gate); event streams "
                                       "and WebSockets are not counted; see docs/rate-limits.md")
    sse_per_tenant: int = setting("TESSERA_SSE_PER_TENANT", 100, integer(0),
                                  doc="event streams a tenant may hold open at once, all replicas together (0: no limit)")
    allow_public_subnets: bool = setting("TESSERA_NETWORKS_ALLOW_PUBLIC_SUBNETS", False, flag,
                                         doc="1: tenant networks may have public subnets; 0: private ranges only")
    # not read from the environment
    idempotency_ttl_s: float = 24 * 3600.0   # how long an Idempotency-Key is remembered
    stream_poll_s: float = 5.0               # an event stream re-reads (or sends a keepalive) this often
    console_poll_s: float = 0.5              # a followed console asks the node for more this often
    node_rpc_timeout_s: float = 5.0          # how long a live read waits for the node-agent's answer
    power_action_grace_s: float = 30.0       # past a deadline, an answer in flight still wins this long
    power_sweep_s: float = 10.0              # actions past deadline and grace are failed this often
    sse_lease_s: float = 60.0                # an event stream's lease lives this long unless renewed (a third of it)

    def __post_init__(self) -> None:
        if not self.token_secret or len(self.token_secret) < MIN_SECRET_CHARS:
            raise SettingError(f"TESSERA_TOKEN_SECRET is required and must have at least {MIN_SECRET_CHARS} characters")
        if self.token_ttl_s <= 0:
            raise SettingError("TESSERA_TOKEN_TTL_S must be a positive number of seconds")
        if self.power_action_ttl_s <= 0:
            raise SettingError("TESSERA_POWER_ACTION_TTL_S must be a positive number of seconds")
        if self.bmc_validate_timeout_s <= 0:
            raise SettingError("TESSERA_BMC_VALIDATE_TIMEOUT_S must be a positive number of seconds")
        self.platform_key()   # a bad key, or a key file that cannot be read, stops the gateway at start

    def platform_key(self) -> bytes | None:
        """The key that seals BMC passwords (None: none configured); raises SettingError for a bad one. Read
        once, in bootstrap (``http.state.Gateway``); the file is not read again per request."""
        try:
            return key_from_env({KEY_VAR: self.secret_key or "", KEY_FILE_VAR: self.secret_key_file or ""})
        except SecretError as exc:
            raise SettingError(str(exc)) from None
