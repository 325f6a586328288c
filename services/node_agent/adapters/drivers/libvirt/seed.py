"""The NoCloud seed ISO of an instance: the three documents of ``domain.vm.cloudinit`` on an ISO 9660
image labelled ``cidata`` (what cloud-init's NoCloud datasource and the project's busybox guest look for),
attached to the domain as a CD-ROM."""
from __future__ import annotations

import io
from pathlib import Path

from shared.files import replace_atomically

from ....domain.vm.cloudinit import Seed, meta_data, network_config, user_data

VOLUME_ID = "cidata"
# (ISO 9660 level-1 name, Rock Ridge / Joliet name): Linux reads the Rock Ridge names, Windows-style readers Joliet.
_FILES = (("METADATA.;1", "meta-data"), ("USERDATA.;1", "user-data"), ("NETCONF.;1", "network-config"))


def write_seed_iso(path: Path, seed: Seed) -> None:
    """Write the seed ISO of ``seed`` to ``path``, atomically (a reader sees the old file or the whole new
    one). Blocking (call it off the event loop); overwrites an existing file; raises OSError."""
    import pycdlib  # imported here: only the libvirt driver needs it

    path = Path(path)
    documents = {"meta-data": meta_data(seed), "user-data": user_data(seed), "network-config": network_config(seed)}
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=VOLUME_ID, rock_ridge="1.09", joliet=3)
    try:
        for iso_name, name in _FILES:
            data = documents[name].encode()
            iso.add_fp(io.BytesIO(data), len(data), "/" + iso_name, rr_name=name, joliet_path="/" + name)
        replace_atomically(path, iso.write_fp, binary=True, mode=0o644)
    finally:
        iso.close()
