"""A node's BMC over Redfish, through sushy (the client Ironic uses).

Every call here blocks (sushy is ``requests`` underneath): callers run them on a worker thread
(``asyncio.to_thread``). Every failure is a ``BmcError`` whose ``kind`` says what went wrong and whose message
quotes the BMC's answer ("HTTP 401 Unauthorized: ..."). Every HTTP request made to the BMC is counted
(``RequestCounter``), so the driver can report how many Redfish calls an allocation took.

Authentication is HTTP basic auth on every request: a BMC without a SessionService (sushy-emulator) answers
it, and nothing is left logged in on the BMC when the node-agent stops. sushy is imported on first use: only a
node that runs this driver needs it.
"""
from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus

import requests

SYSTEMS_PREFIX = "/redfish/v1/Systems/"
ERROR_TEXT_LIMIT = 500
KINDS = ("unreachable", "unauthorized", "not_found", "refused", "timeout")


@dataclass(frozen=True)
class BmcConfig:
    """How to reach a node's BMC and which system of it is the node. ``ca_bundle``: PEM text to verify the BMC's
    certificate with (instead of the system's CAs); ``verify_tls`` False: no verification at all."""

    url: str
    system_id: str          # "/redfish/v1/Systems/<id>", or only "<id>"
    username: str
    password: str
    verify_tls: bool = True
    ca_bundle: str | None = None

    def __repr__(self) -> str:   # never the password
        return (f"BmcConfig(url={self.url!r}, system_id={self.system_id!r}, username={self.username!r}, "
                f"password='***', verify_tls={self.verify_tls!r}, ca_bundle={'<PEM>' if self.ca_bundle else None})")

    __str__ = __repr__

    @property
    def system_path(self) -> str:
        return self.system_id if self.system_id.startswith("/") else SYSTEMS_PREFIX + self.system_id


class BmcError(Exception):
    """The BMC could not be used. ``kind``: unreachable, unauthorized, not_found, refused (it answered with an
    error) or timeout; ``str(exc)`` quotes its answer."""

    def __init__(self, kind: str, message: str):
        assert kind in KINDS, kind
        super().__init__(message)
        self.kind = kind


class RequestCounter:
    """How many HTTP requests went to the BMC (thread-safe: sushy runs on worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        with self._lock:
            self.count += 1


def _counting_connector(url: str, counter: RequestCounter, **kw):
    """sushy's connector, counting every request its HTTP session sends (retries and redirects included)."""
    from sushy.connector import Connector

    connector = Connector(url, **kw)
    send = connector._session.send

    def counted(request, **kwargs):
        counter.add()
        return send(request, **kwargs)
    connector._session.send = counted
    return connector


def _status_text(exc) -> str:
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = ""
    detail = exc.detail or (exc.body or {}).get("message") or ""
    text = f"HTTP {exc.status_code} {phrase}".rstrip() + (f": {detail}" if detail else "")
    return text[:ERROR_TEXT_LIMIT]


@contextmanager
def answers(what: str) -> Iterator[None]:
    """Turn sushy's exceptions inside into BmcError naming ``what`` was asked and the BMC's answer."""
    from sushy import exceptions as sushy_exc

    try:
        yield
    except sushy_exc.AccessError as exc:
        raise BmcError("unauthorized", f"the BMC refused the credentials: {_status_text(exc)} ({what})") from None
    except sushy_exc.ResourceNotFoundError as exc:
        raise BmcError("not_found", f"the BMC has no such resource: {_status_text(exc)} ({what})") from None
    except sushy_exc.HTTPError as exc:
        raise BmcError("refused", f"the BMC refused {what}: {_status_text(exc)}") from None
    except sushy_exc.ConnectionError as exc:
        cause = exc.__context__
        if isinstance(cause, requests.exceptions.Timeout):
            raise BmcError("timeout", f"the BMC did not answer in time ({what}): {cause}"[:ERROR_TEXT_LIMIT]) from None
        raise BmcError("unreachable", f"the BMC is unreachable ({what}): {cause or exc}"[:ERROR_TEXT_LIMIT]) from None
    except sushy_exc.SushyError as exc:   # a malformed or incomplete answer
        raise BmcError("refused", f"the BMC's answer to {what} is unusable: {exc}"[:ERROR_TEXT_LIMIT]) from None


class BmcClient:
    """A connection to one system of a BMC, opened on first use. Blocking; raises BmcError. ``close()`` it."""

    def __init__(self, config: BmcConfig, counter: RequestCounter | None = None, *, timeout_s: float = 30,
                 retries: int = 2):
        self.config = config
        self.counter = counter or RequestCounter()
        self._timeout_s = timeout_s
        self._retries = retries
        self._root = None
        self._system = None
        self._ca_file: str | None = None
        self.changed = False   # whether a request that changes the system was sent (or attempted)

    def _verify(self) -> bool | str:
        if not self.config.verify_tls:
            return False
        if self.config.ca_bundle:
            if self._ca_file is None:
                fd, self._ca_file = tempfile.mkstemp(prefix="tessera-bmc-ca-", suffix=".pem")
                with os.fdopen(fd, "w") as f:
                    f.write(self.config.ca_bundle)
            return self._ca_file
        return True

    def system(self):
        """The sushy System (fetched once; ``refresh()`` it for current values)."""
        if self._system is None:
            import sushy

            with answers("the service root"):
                connector = _counting_connector(self.config.url, self.counter, verify=self._verify(),
                                               server_side_retries=self._retries, server_side_retries_delay=1,
                                               default_request_timeout=self._timeout_s,
                                               connect_timeout=min(10.0, self._timeout_s))
                self._root = sushy.Sushy(self.config.url, auth=sushy.auth.BasicAuth(self.config.username,
                                                                                      self.config.password),
                                         connector=connector)
            with answers(f"system {self.config.system_path}"):
                self._system = self._root.get_system(self.config.system_path)
        return self._system

    def power_state(self) -> str:
        """The system's power state as the BMC says it now ("On", "Off", "PoweringOn", ...)."""
        system = self.system()
        with answers("the power state"):
            system.refresh(force=True)
            state = system.power_state
        return state.value if state is not None else "Unknown"

    def reset(self, reset_type: str) -> None:
        """A ComputerSystem.Reset: "On", "ForceOff", "ForceRestart", "GracefulRestart", "GracefulShutdown"..."""
        import sushy

        system = self.system()
        with answers(f"reset {reset_type}"):
            self.changed = True
            system.reset_system(sushy.ResetType(reset_type))

    def _cd(self):
        system = self.system()
        with answers("virtual media Cd"):
            return system.virtual_media.get_member(f"{system.path.rstrip('/')}/VirtualMedia/Cd")

    def insert_cd(self, image_url: str) -> None:
        cd = self._cd()
        with answers("InsertMedia"):
            self.changed = True
            cd.insert_media(image_url, inserted=True, write_protected=True)

    def eject_cd(self) -> None:
        """Eject the Cd's media; nothing when none is inserted."""
        cd = self._cd()
        with answers("EjectMedia"):
            cd.refresh(force=True)
            if cd.inserted or cd.image:
                self.changed = True
                cd.eject_media()

    def boot_once_from_cd(self) -> str:
        """Boot from Cd at the next power on (legacy BIOS); the override the BMC reports back (an emulator says
        Continuous for Once)."""
        import sushy

        system = self.system()
        with answers("the boot override"):
            self.changed = True
            system.set_system_boot_options(sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.ONCE,
                                           mode=sushy.BootSourceOverrideMode.LEGACY)
            system.refresh(force=True)
            enabled = system.boot.enabled
        return enabled.value if enabled is not None else "Unknown"

    def first_mac(self) -> str | None:
        """The first MAC address the system's EthernetInterfaces list, or None."""
        system = self.system()
        with answers("the EthernetInterfaces"):
            for nic in system.ethernet_interfaces.get_members():
                if nic.mac_address:
                    return str(nic.mac_address).lower()
        return None

    def describe(self) -> dict:
        system = self.system()
        with answers(f"system {self.config.system_path}"):
            system.refresh(force=True)
            return {"power_state": system.power_state.value if system.power_state else None,
                    "model": system.model, "manufacturer": system.manufacturer, "serial": system.serial_number,
                    "system_id": system.path}

    def close(self) -> None:
        root, self._root, self._system = self._root, None, None
        if root is not None and root._conn is not None:
            root._conn.close()
        if self._ca_file is not None:
            try:
                os.unlink(self._ca_file)
            except OSError:
                pass
            self._ca_file = None

    def __enter__(self) -> BmcClient:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def validate(config: BmcConfig, *, timeout_s: float = 30) -> dict:
    """Reach the BMC, log in, read the system: {power_state, model, manufacturer, serial, system_id}. Blocking;
    raises BmcError."""
    with BmcClient(config, timeout_s=timeout_s, retries=1) as client:
        return client.describe()
