"""HTTP models of the image catalog (like Glance's images, kept small: ``format`` is Glance's disk_format,
``sha256`` its os_hash_value, ``min_disk_gb`` its min_disk, ``tenant_id`` its owner, ``kernel``/``initrd``
its kernel_id/ramdisk_id as locations the nodes read)."""
from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from ...http.schema_base import UUID_PATTERN, Body, Int, Out, ShapeName, Uuid, omittable, text

# An absolute path on the nodes, or an http(s) URL they can reach: visible ASCII, no spaces.
LOCATION = (r"^(?:/[!-~]*|https?://(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
            r"(?::[0-9]{1,5})?(?:/[!-~]*)?)$")
Location = text(1024, min_length=1, pattern=LOCATION)
OsName = text(63, min_length=1)
KernelArgs = text(1024)
Sha256 = text(64, min_length=64, pattern=r"^[0-9a-f]{64}$")
ImageFormat = Literal["qcow2", "raw"]
Visibility = Literal["public", "private"]
# The rules of ``ImageCreate.rule_errors`` (a 422 naming the field), as JSON Schema states them.
_IMAGE_RULES = {
    "allOf": [
        {"if": {"properties": {"visibility": {"const": "private"}}, "required": ["visibility"]},
         "then": {"required": ["tenant_id"]}, "else": {"properties": {"tenant_id": False}}},
        {"if": {"properties": {"default": {"const": True}}, "required": ["default"]},
         "then": {"properties": {"visibility": {"const": "public"}}}},
        {"not": {"properties": {"name": {"pattern": UUID_PATTERN}}, "required": ["name"]}},
    ],
    "dependentRequired": {"initrd": ["kernel"], "kernel_args": ["kernel"]},
}


class ImageCreate(Body):
    """A private image names its tenant (and only a private one does); the default image is public; initrd
    and kernel_args go with a kernel; a name is not an id (an allocation names an image by either)."""

    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "created_at", "created_by", "links"})
    model_config = ConfigDict(json_schema_extra=_IMAGE_RULES)
    name: ShapeName = Field(description="Unique in the catalog: lower case, digits, '.' and '-' (e.g. ubuntu-24.04).")
    os: OsName = Field(description="The operating system, for people (e.g. 'Ubuntu 24.04').")
    format: ImageFormat
    source: Location = Field(description="Where the nodes read the image: an absolute path or an http(s) URL.")
    sha256: Sha256 = Field(description="Lower-case hex SHA-256 of the image file; the node checks it.")
    min_disk_gb: Int = Field(default=1, ge=1, le=65536, description="The root disk the image needs.")
    visibility: Visibility = Field(description="public: every tenant; private: only `tenant_id`'s members.")
    tenant_id: Uuid = omittable(description="The tenant a private image belongs to (an existing tenant).")
    kernel: Location = omittable(description="Direct kernel boot: the kernel's path or URL.")
    initrd: Location = omittable(description="Direct kernel boot: the initramfs (needs a kernel).")
    kernel_args: KernelArgs = omittable(description="Direct kernel boot: the kernel command line (needs a kernel).")
    default: bool = Field(default=False, description="The image an allocation naming none boots; setting it "
                                                     "takes it from the previous default. Only a public image.")

    def rule_errors(self) -> list[tuple[str, str]]:
        """(field, message) for each rule the fields break together."""
        errors = []
        if re.fullmatch(UUID_PATTERN, self.name):
            errors.append(("name", "a name that reads as an id would be ambiguous; an image's id is given to it"))
        if self.visibility == "private" and self.tenant_id is None:
            errors.append(("tenant_id", "a private image names the tenant it belongs to"))
        if self.visibility == "public" and self.tenant_id is not None:
            errors.append(("tenant_id", "only a private image belongs to a tenant"))
        if self.default and self.visibility != "public":
            errors.append(("default", "the default image must be public"))
        errors += [(f, "goes with a kernel") for f in ("initrd", "kernel_args")
                   if getattr(self, f) is not None and self.kernel is None]
        return errors


class ImageLinks(Out):
    self: str


class ImageOut(Out):
    """An image of the catalog."""

    id: uuid.UUID
    name: str
    os: str
    format: ImageFormat
    source: str
    sha256: str
    min_disk_gb: int
    visibility: Visibility
    tenant_id: uuid.UUID | None = None
    kernel: str | None = None
    initrd: str | None = None
    kernel_args: str | None = None
    default: bool
    created_at: datetime
    links: ImageLinks


class ImagePage(Out):
    """One page of the images the caller may see, newest first."""

    items: list[ImageOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")
