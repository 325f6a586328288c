"""The redfish driver: a bare-metal node is one physical server, provisioned through its BMC over Redfish.

The node-agent runs out-of-band (as Ironic's conductor does): it never runs on the server it provisions. One
allocation at a time has the server. Provisioning runs these phases, each timed and bounded by its timeout
(``RedfishConfig.timeouts``):

  power_off      ForceOff, then the power state polled until Off
  insert_media   the allocation's boot ISO (kernel, initrd, NoCloud seed with a phone_home URL; its tenant
                 address primary, its provisioning address beside it: ``network``) built and served, then
                 InsertMedia into the system's virtual media Cd (before the boot override: a BMC may have no Cd
                 device until media is inserted)
  boot_override  boot once from Cd, legacy BIOS (an emulator reports Continuous back: accepted)
  power_on       On, then polled until On
  deploy         until the server phones home with this allocation's token

A failure raises DriverError "<phase>: <why, quoting the BMC>", after a best-effort compensation (power off,
eject, the ISO withdrawn, the record removed). The ISO is the instance's root file system (a ramdisk image), so
it stays inserted while the instance lives; start and reboot set the one-time boot from Cd again first.

Volumes: a btrfs volume is a directory on the storage host, shared with VMs (virtiofs) and namespace slots (bind
mounts); nothing carries it to a physical server over the network, so a provision naming one fails at once with
that reason (no BMC call is made). An appliance's volume (lustre, vast, weka) is rendered only, as everywhere here:
its client mount command is kept in the record and the mount reported ``simulated``. There is no live mount.

The BMC comes from the node (``bind``'s ``bmc``: the registered BMC, its password unsealed), so a
BMC registered or changed at run time is used from the next operation on. Records live in the state directory
(``records``) and survive a restart of the node-agent. sushy blocks: every BMC call runs on a worker thread. A
phase that runs out of time stops waiting for its thread (it ends with sushy's own request timeout); the
compensation waits for that call to end before it undoes what it did (a power-on landing after the power-off
would leave the server on), then works on a fresh connection.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

import structlog

from ....domain.model import Instance, InstanceSpec
from ....domain.vm import cloudinit
from ....domain.volumes import MountedVolume, Volume, simulated_mount
from ..base import BmcSource, DriverError, InstanceStarted, PowerAction, ProvisioningDriver
from ..libvirt.images import ImageError, boot_file
from .bmc import BmcClient, BmcConfig, BmcError, RequestCounter
from .bmc import validate as validate_bmc
from .config import RedfishConfig
from .media import MediaError, MediaServer, build_iso, new_token
from .network import network_info, server_seed, tenant_addresses
from .records import Records, instance_id

log = structlog.get_logger()
_LATE = {"power_off": "the server did not power off", "insert_media": "the BMC did not take the boot media",
         "boot_override": "the BMC did not set the boot override", "power_on": "the server did not power on",
         "deploy": "the server did not report ready", "eject": "the BMC did not eject the media"}
_POWER = {"On": "running", "PoweringOn": "running", "Off": "stopped", "PoweringOff": "stopped"}


class _Run:
    """One operation on the BMC: its connection, the requests it made, the phases it ran."""

    def __init__(self, bmc: BmcConfig, counter: RequestCounter | None = None):
        self.bmc = bmc
        self.counter = counter or RequestCounter()
        self.client = BmcClient(bmc, self.counter)
        self.phases: list[dict] = []
        self.last_state: str | None = None
        self.inflight: set[asyncio.Future] = set()

    def call(self, fn: Callable, *args) -> Awaitable:
        """A blocking BMC call on a worker thread. A phase's timeout stops the wait, not the call: the call is kept
        in ``inflight`` until it ends, so a compensation can wait for it."""
        future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        self.inflight.add(future)
        future.add_done_callback(self.inflight.discard)
        return asyncio.shield(future)

    def close(self) -> None:
        self.client.close()


class RedfishDriver(ProvisioningDriver):
    name = "redfish"
    persistent = True
    def __init__(self, config: RedfishConfig, bmc_source: BmcSource | None = None):
        """``bmc_source``: the BMC to drive (a lab's, a test's); None: the one the node registered (``bind``)."""
        self.config = config
        self._bmc_source = bmc_source
        self.records = Records(config.records_dir)
        self.media = MediaServer(config.media_listen, config.media_url)
        self.node_id: uuid.UUID | None = None
        self._lock = asyncio.Lock()   # the server is one: one operation on it at a time

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RedfishDriver:
        return cls(RedfishConfig.from_env(environ))

    def bind(self, node_id: uuid.UUID, topology: Callable[[], dict], *, instance_started: InstanceStarted | None = None,
             bmc: BmcSource | None = None) -> None:
        self.node_id = node_id
        if self._bmc_source is None:
            self._bmc_source = bmc

    async def close(self) -> None:
        """Stop the media server (the records stay)."""
        await self.media.close()

    async def validate(self, bmc: BmcConfig) -> dict:
        """Reach the BMC with these credentials and read its system: {power_state, model, manufacturer, serial,
        system_id}. Raises BmcError (its ``kind`` says what failed)."""
        return await asyncio.to_thread(validate_bmc, bmc)

    async def _bmc(self) -> BmcConfig:
        bmc = await self._bmc_source() if self._bmc_source is not None else None
        if bmc is None:
            raise DriverError("no BMC registered for this node")
        return bmc

    # -- phases -----------------------------------------------------------------------------------------
    async def _phase(self, run: _Run, name: str, step: Callable[[], Awaitable]):
        """Run ``step`` bounded by the phase's timeout, recording its duration; DriverError "<name>: ..."."""
        limit = self.config.timeout(name)
        began = time.monotonic()
        try:
            async with asyncio.timeout(limit):
                return await step()
        except TimeoutError:
            seen = f" (the BMC last said {run.last_state})" if name.startswith("power") and run.last_state else ""
            raise DriverError(f"{name}: {_LATE[name]} within {limit:g} s{seen}") from None
        except (BmcError, MediaError) as exc:
            raise DriverError(f"{name}: {exc}") from None
        finally:
            run.phases.append({"name": name, "seconds": round(time.monotonic() - began, 3)})

    async def _power_to(self, run: _Run, reset: str, target: str, *, force: bool = False) -> None:
        """Reset unless the server is already at ``target`` (``force``: always), then poll until it is."""
        run.last_state = await run.call(run.client.power_state)
        if run.last_state == target and not force:
            return
        await run.call(run.client.reset, reset)
        while True:
            run.last_state = await run.call(run.client.power_state)
            if run.last_state == target:
                return
            await asyncio.sleep(self.config.poll_s)

    async def _insert_media(self, run: _Run, spec: InstanceSpec, token: str) -> None:
        await self.media.start()
        mac = self.config.server_mac or await run.call(run.client.first_mac)
        if mac is None:
            raise MediaError("the BMC lists no MAC address for the system: set TESSERA_REDFISH_SERVER_MAC")
        image = spec.guest.image
        if not image.kernel or not image.initrd:
            raise MediaError(f"image {image.name} has no kernel and initrd: a bare-metal server boots them from "
                             "its virtual media")
        try:
            seed = server_seed(spec, self.config, instance_id=instance_id(spec.allocation_id), mac=mac,
                               phone_home=self.media.phone_home_url(token))
            images = self.config.images_dir
            images.mkdir(parents=True, exist_ok=True)
            kernel = await asyncio.to_thread(boot_file, image.kernel, images, image.name)
            initrd = await asyncio.to_thread(boot_file, image.initrd, images, image.name)
        except (ValueError, ImageError, OSError) as exc:
            raise MediaError(str(exc)) from None
        iso = self.config.media_dir / f"{token}.iso"
        await asyncio.to_thread(build_iso, iso, kernel, initrd, image.kernel_args or "console=ttyS0", {
            "meta-data": cloudinit.meta_data(seed), "user-data": cloudinit.user_data(seed),
            "network-config": cloudinit.network_config(seed)})
        iso_url, _ = self.media.offer(token, iso)
        await run.call(run.client.insert_cd, iso_url)

    async def _deploy(self, token: str, expected: str):
        report = await self.media.wait_phone_home(token)
        if report.instance_id != expected:
            raise MediaError(f"the server phoned home as instance {report.instance_id!r}, not {expected}")
        return report

    # -- provision --------------------------------------------------------------------------------------
    async def provision(self, spec: InstanceSpec) -> str:
        async with self._lock:
            record = self.records.get(spec.allocation_id)
            if record is not None and record.get("status") == "ready":
                return record["instance_id"]
            other = next((r for r in self.records.all() if r["allocation_id"] != str(spec.allocation_id)), None)
            if other is not None:
                raise DriverError(f"the server already runs allocation {other['allocation_id']} (instance "
                                  f"{other['instance_id']}): a bare-metal node has one instance at a time")
            if spec.guest is None:
                raise DriverError("no image: the allocation names none and the catalog has no default image")
            _bare_metal_mounts(spec.volumes)
            bmc = await self._bmc()
            if record is not None:   # a provisioning cut short (the agent restarted): start over, from power off
                self._drop_media(record.get("token"))
            return await self._provision(spec, bmc)

    async def _provision(self, spec: InstanceSpec, bmc: BmcConfig) -> str:
        token, iid, run = new_token(), instance_id(spec.allocation_id), _Run(bmc)
        record = {"allocation_id": str(spec.allocation_id), "instance_id": iid, "slots": list(spec.slots),
                  "image": spec.guest.image.name, "hostname": spec.guest.hostname, "status": "provisioning",
                  "token": token, "started_at": time.time(), "addresses": tenant_addresses(spec),
                  "mounts": [m.record() for m in _bare_metal_mounts(spec.volumes)]}
        self.records.save(record)
        try:
            await self._phase(run, "power_off", lambda: self._power_to(run, "ForceOff", "Off"))
            await self._phase(run, "insert_media", lambda: self._insert_media(run, spec, token))
            await self._phase(run, "boot_override", lambda: run.call(run.client.boot_once_from_cd))
            powering = time.time()
            await self._phase(run, "power_on", lambda: self._power_to(run, "On", "On"))
            report = await self._phase(run, "deploy", lambda: self._deploy(token, iid))
        except DriverError as exc:
            problems = await self._compensate(run, token, spec.allocation_id)
            if problems:
                raise DriverError(f"{exc}; the cleanup failed too: {problems}") from None
            raise
        except BaseException:
            await self._compensate(run, token, spec.allocation_id)
            raise
        finally:
            run.close()
        record.update(status="ready", phases=run.phases, redfish_calls=run.counter.count, booted_at=report.at,
                      boot_s=round(report.at - powering, 3), address=report.ip)
        self.records.save(record)
        log.info("redfish.provisioned", instance=iid, phases=run.phases, redfish_calls=run.counter.count)
        return iid

    async def _compensate(self, failed: _Run, token: str, allocation_id: uuid.UUID) -> str:
        """Power off and eject (best effort, also when the caller is cancelled; not when no request that changes
        the server was sent), withdraw the ISO, forget the record; what could not be undone, or ""."""
        async def undo() -> str:
            if failed.inflight:   # a call a timed-out phase left running: let it land before undoing it
                await asyncio.wait(set(failed.inflight), timeout=self.config.timeout("power_off"))
            run = _Run(failed.bmc, failed.counter)   # fresh: the failed phase's thread may still hold the old one
            steps = (("power_off", lambda: self._power_to(run, "ForceOff", "Off")),
                     ("eject", lambda: run.call(run.client.eject_cd)))
            problems = []
            try:
                for name, step in steps if failed.client.changed else ():
                    try:
                        await asyncio.wait_for(step(), self.config.timeout(name))
                    except (BmcError, TimeoutError) as exc:
                        problems.append(f"{name}: {str(exc) or f'timed out after {self.config.timeout(name):g} s'}")
            finally:
                run.close()
                self._drop_media(token)
                self.records.remove(allocation_id)
            if problems:
                log.warning("redfish.compensation_incomplete", allocation_id=str(allocation_id), problems=problems)
            return "; ".join(problems)
        return await asyncio.shield(asyncio.ensure_future(undo()))

    def _drop_media(self, token: str | None) -> None:
        self.media.withdraw(token)
        if token:
            (self.config.media_dir / f"{token}.iso").unlink(missing_ok=True)

    # -- deprovision ------------------------------------------------------------------------------------
    async def deprovision(self, allocation_id: uuid.UUID) -> None:
        """Power off, eject, forget the record (wiping the server's disks is another component's job).
        Idempotent; raises DriverError "<phase>: ..." and keeps the record when the BMC fails."""
        async with self._lock:
            record = self.records.get(allocation_id)
            if record is None:
                return
            run = _Run(await self._bmc())
            try:
                await self._phase(run, "power_off", lambda: self._power_to(run, "ForceOff", "Off"))
                await self._phase(run, "eject", lambda: run.call(run.client.eject_cd))
            finally:
                run.close()
            self._drop_media(record.get("token"))
            self.records.remove(allocation_id)
            log.info("redfish.deprovisioned", instance=record.get("instance_id"), redfish_calls=run.counter.count)

    # -- fence ------------------------------------------------------------------------------------------
    async def fence(self, allocation_id: uuid.UUID) -> None:
        """The allocation runs no more on the server, confirmed: ForceOff and the power state read back until Off
        (the power_off phase and its timeout), also when no record of it is kept (a record lost must not leave the
        server running); then eject, the ISO withdrawn, the record forgotten (best effort: the server is off).
        Raises DriverError, keeping the record, when the power-off is not confirmed, and without a BMC call when
        the server runs another allocation (that one is not this fence's to stop)."""
        async with self._lock:
            other = next((r for r in self.records.all() if r["allocation_id"] != str(allocation_id)), None)
            if other is not None:
                raise DriverError(f"the server runs allocation {other['allocation_id']}, not {allocation_id}: "
                                  "not powered off")
            record = self.records.get(allocation_id)
            run = _Run(await self._bmc())
            try:
                await self._phase(run, "power_off", lambda: self._power_to(run, "ForceOff", "Off"))
                if record is not None:
                    try:
                        await self._phase(run, "eject", lambda: run.call(run.client.eject_cd))
                    except DriverError as exc:   # the media stays inserted; the next provision inserts its own
                        log.warning("redfish.fence_eject_failed", allocation_id=str(allocation_id), error=str(exc))
            finally:
                run.close()
            if record is not None:
                self._drop_media(record.get("token"))
                self.records.remove(allocation_id)
            log.warning("redfish.fenced", allocation_id=str(allocation_id), instance=(record or {}).get("instance_id"),
                        phases=run.phases, redfish_calls=run.counter.count)

    # -- what runs here ---------------------------------------------------------------------------------
    @staticmethod
    def _instance(record: dict) -> Instance:
        return Instance(uuid.UUID(record["allocation_id"]), record["instance_id"], tuple(record.get("slots", ())))

    async def list_instances(self) -> list[Instance]:
        return [self._instance(r) for r in self.records.all()]

    async def instance_of(self, allocation_id: uuid.UUID) -> Instance | None:
        record = self.records.get(allocation_id)
        return self._instance(record) if record is not None else None

    async def _power_state(self) -> str:
        """running, stopped, or unknown when the BMC cannot say (these reads are not counted in the record)."""
        bmc = await self._bmc_source() if self._bmc_source is not None else None
        if bmc is None:
            return "unknown"
        with BmcClient(bmc) as client:
            try:
                return _POWER.get(await asyncio.to_thread(client.power_state), "unknown")
            except BmcError as exc:
                log.warning("redfish.power_state_unknown", error=str(exc), kind=exc.kind)
                return "unknown"

    async def instance_info(self, allocation_id: uuid.UUID) -> dict:
        record = self.records.get(allocation_id)
        if record is None:
            return {"passthrough": "real"}
        booted = record.get("booted_at")
        return {**network_info(self.config, record),
                "passthrough": "real", "image": record.get("image"), "hostname": record.get("hostname"),
                "booted_at": datetime.fromtimestamp(booted, UTC).isoformat() if booted else None,
                "boot_s": record.get("boot_s"), "power_state": await self._power_state(),
                "phases": list(record.get("phases", [])), "redfish_calls": int(record.get("redfish_calls", 0)),
                "mounts": [MountedVolume.from_record(m).info() for m in record.get("mounts", [])]}

    # -- tenant operations ------------------------------------------------------------------------------
    async def power(self, allocation_id: uuid.UUID, action: PowerAction) -> str:
        """stop: ForceOff; start: the one-time boot from Cd, then On; reboot: the same, then ForceRestart (On when
        the server is off). Polled to the target state; the calls are added to the record's count."""
        async with self._lock:
            record = self.records.get(allocation_id)
            if record is None or record.get("status") != "ready":
                raise DriverError(f"no instance of allocation {allocation_id} on this node")
            run = _Run(await self._bmc())
            try:
                if action == "stop":
                    await self._phase(run, "power_off", lambda: self._power_to(run, "ForceOff", "Off"))
                    state = "stopped"
                else:
                    await self._phase(run, "power_on", lambda: self._start(run, restart=action == "reboot"))
                    state = "running"
            finally:
                run.close()
                record["redfish_calls"] = int(record.get("redfish_calls", 0)) + run.counter.count
                self.records.save(record)
        return state

    async def _start(self, run: _Run, *, restart: bool) -> None:
        run.last_state = await run.call(run.client.power_state)
        running = run.last_state == "On"
        if running and not restart:
            return
        await run.call(run.client.boot_once_from_cd)
        if running:
            await self._power_to(run, "ForceRestart", "On", force=True)
        else:
            await self._power_to(run, "On", "On")


def _bare_metal_mounts(volumes: tuple[Volume, ...]) -> list[MountedVolume]:
    """The rendered mounts of appliance volumes; DriverError for a btrfs volume (a path on the storage host)."""
    paths = [v for v in volumes if not v.simulated]
    if paths:
        raise DriverError(f"volume {paths[0].volume_id} ({paths[0].backend}) is a directory on the storage host: it "
                          "cannot be mounted into a bare-metal server over the network")
    return [simulated_mount(v) for v in volumes]
