"""The gateway's own settings (the kit's ``ServiceSettings`` are read beside them), built once in bootstrap.

  TESSERA_TOKEN_SECRET         required, at least 32 characters: the HS256 key of access tokens
  TESSERA_TOKEN_TTL_S          [900]  seconds an access token lives
  TESSERA_BOOTSTRAP_ADMIN_KEY  optional: the API key of the provider admin ``admin``
  TESSERA_CONSOLE_FOLLOW_MAX_S [3600] seconds a followed console stream lasts at most
  TESSERA_POWER_ACTION_TTL_S   [300]  seconds a power action may wait for its node: the command's deadline
  TESSERA_SECRET_KEY           optional: the platform's secret key (32 bytes, base64) that seals BMC passwords
  TESSERA_SECRET_KEY_FILE      optional: a file holding that key (read once, at start); without either, a BMC
                               cannot be registered (503)
  TESSERA_BMC_VALIDATE_TIMEOUT_S [45] seconds POST /v1/nodes/{id}/bmc/validate waits for the node-agent

A missing or short secret, a secret key that is not 32 bytes of base64 (or a key file that cannot be read), or a
TTL that is not a positive integer, raises SettingError naming the variable (no secret's value is ever repeated
in the message).
"""
from __future__ import annotations

from dataclasses import dataclass

from shared.secrets import KEY_FILE_VAR, KEY_VAR, SecretError, key_from_env
from shared.settings import SettingError, integer, number, setting

MIN_SECRET_CHARS = 32


@dataclass(frozen=True)
class GatewaySettings:
    token_secret: str = setting("TESSERA_TOKEN_SECRET", "",
                                doc=f"the HS256 key of access tokens (required, at least {MIN_SECRET_CHARS} characters)")
    token_ttl_s: int = setting("TESSERA_TOKEN_TTL_S", 900, integer(1), doc="seconds an access token lives")
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
    # not read from the environment
    idempotency_ttl_s: float = 24 * 3600.0   # how long an Idempotency-Key is remembered
    stream_poll_s: float = 5.0               # an event stream re-reads (or sends a keepalive) this often
    console_poll_s: float = 0.5              # a followed console asks the node for more this often
    node_rpc_timeout_s: float = 5.0          # how long a live read waits for the node-agent's answer
    power_action_grace_s: float = 30.0       # past a deadline, an answer in flight still wins this long
    power_sweep_s: float = 10.0              # actions past deadline and grace are failed this often

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
