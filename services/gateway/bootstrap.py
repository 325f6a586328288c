"""The only place the gateway's adapters are built and wired; its own settings are read here.

Environment (besides shared.config's TESSERA_*): TESSERA_TOKEN_SECRET (required, at
least 32 characters: the HS256 key), TESSERA_TOKEN_TTL_S (default 900),
TESSERA_BOOTSTRAP_ADMIN_KEY (optional: the API key of the provider admin ``admin``).
"""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from shared.settings import ServiceSettings
from shared.runtime import Runtime

from .app import create_app
from .entrypoints import bus
from .housekeeping import purge_idempotency_keys_forever
from .state import GatewayConfig

MIN_SECRET_CHARS = 32


class ConfigError(ValueError):
    """The gateway cannot start with this configuration."""


def check_config(config: GatewayConfig) -> GatewayConfig:
    """Raises ConfigError for a missing/short token secret or a non-positive TTL."""
    if not config.token_secret or len(config.token_secret) < MIN_SECRET_CHARS:
        raise ConfigError(f"TESSERA_TOKEN_SECRET is required and must have at least {MIN_SECRET_CHARS} characters")
    if config.token_ttl_s <= 0:
        raise ConfigError("TESSERA_TOKEN_TTL_S must be a positive number of seconds")
    return config


def config_from_env(env: dict[str, str] | None = None) -> GatewayConfig:
    env = os.environ if env is None else env
    try:
        ttl = int(env.get("TESSERA_TOKEN_TTL_S") or 900)
    except ValueError:
        raise ConfigError("TESSERA_TOKEN_TTL_S must be an integer") from None
    return check_config(GatewayConfig(token_secret=env.get("TESSERA_TOKEN_SECRET", ""), token_ttl_s=ttl,
                                      bootstrap_admin_key=env.get("TESSERA_BOOTSTRAP_ADMIN_KEY") or None))


def build(settings: ServiceSettings | None = None, config: GatewayConfig | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("gateway")
    config = check_config(config) if config is not None else config_from_env()
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt)
    create_app(rt, config)
    rt.background(partial(purge_idempotency_keys_forever, rt, config.idempotency_ttl_s))
    return rt
