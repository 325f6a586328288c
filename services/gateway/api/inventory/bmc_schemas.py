"""HTTP models of a node's BMC (bare metal through Redfish): its registration (the password write-only), how it is
shown (never the password, sealed or not) and what a validation found."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from ...http.schema_base import Body, Out, text

# A BMC's Redfish service root: http or https, visible ASCII only (an IDN host is written in punycode), no
# user:password@ before the host (the URL is shown and logged; the credentials are username and password).
BMC_URL = text(1024, min_length=1, pattern=r"^https?://[!-.0-?A-~]+(?:/[!-~]*)?$")
# /redfish/v1/Systems/<id>, or only <id> (the node-agent puts the prefix in front)
SYSTEM_ID = text(512, min_length=1, pattern=r"^(?:/redfish/v1/Systems/)?[A-Za-z0-9._~%:@-]+$")
# visible ASCII, no space at either end; the password: printable ASCII, spaces anywhere (at most 1024 bytes, so
# sealed it stays within the node-agent contract's 4096 characters)
USERNAME = text(255, min_length=1, pattern=r"^[!-~]([ -~]*[!-~])?$")
PASSWORD = text(1024, min_length=1, pattern=r"^[ -~]+$")
# PEM certificates (RFC 7468: base64 lines of at most 76 characters), LF or CRLF line ends. At most 32 KiB (about
# 20 certificates), so a body with the longest values of every field stays within the 64 KiB a body may have.
MAX_CA_BUNDLE_CHARS = 32 * 1024
_CERT = r"-----BEGIN CERTIFICATE-----\r?\n(?:[A-Za-z0-9+/=]{1,76}\r?\n)+-----END CERTIFICATE-----"
CA_BUNDLE = text(MAX_CA_BUNDLE_CHARS, min_length=1, pattern=rf"^(?:{_CERT}\r?\n)*{_CERT}(?:\r?\n)?$", multiline=True)


class BmcSet(Body):
    """A node's BMC. The password is write-only: sealed with the platform's key before it is stored or sent to
    the node's agent, it is never returned or logged."""

    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"node_id", "password_set", "password_sealed", "version", "updated_at", "updated_by"})
    url: BMC_URL = Field(description="The BMC's Redfish service root, e.g. https://10.0.0.5 (http or https; no "
                                     "user:password@ in it).")
    system_id: SYSTEM_ID = Field(description="The node's Redfish system: /redfish/v1/Systems/<id>, or only <id>.")
    username: USERNAME
    password: PASSWORD = Field(description="Write-only: sealed at rest with the platform's key; never returned or "
                                           "logged. Printable ASCII.")
    verify_tls: bool = Field(default=True, description="Verify the BMC's TLS certificate (false: not at all).")
    ca_bundle: CA_BUNDLE | None = Field(default=None, description="PEM certificates to verify the BMC's certificate "
                                                                  "with, instead of the system's CAs.")


class BmcOut(Out):
    """A node's BMC as registered, without its password."""

    node_id: uuid.UUID
    url: str
    system_id: str
    username: str
    verify_tls: bool
    ca_bundle: str | None = None
    password_set: bool = Field(description="Always true: a BMC is registered with its password, which is never shown.")
    version: int = Field(description="Raised by every change (and removal) of the node's BMC.")
    updated_at: datetime
    updated_by: uuid.UUID


class BmcReport(Out):
    """What the node's agent found asking the BMC: reachable, credentials accepted, the system it describes. A
    check that ran and failed (a wrong password: `unauthorized`) is `ok: false`, naming the kind of failure."""

    ok: bool
    error_kind: Literal["unreachable", "unauthorized", "not_found", "refused", "timeout", "no_driver"] | None = None
    error: str | None = None
    power_state: str | None = None
    model: str | None = None
    manufacturer: str | None = None
    serial: str | None = None
    elapsed_s: float = Field(default=0.0, description="Seconds the check took on the node.")
