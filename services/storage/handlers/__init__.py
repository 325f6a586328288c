"""Storage's handlers, each (unit of work, message) -> effect within the consumer's transaction.

volumes      tenant commands: create, resize, destroy a volume; set a quota
attachments  live attach and detach, settled by the node's mount reports
steps        saga step: provision the allocation's volumes (scratch and named), delete them (undo)
reports      on its own: the classes on offer (on start), what the volumes use (periodically)
lifecycle    what they share: quota admission, backend calls, publishing a change
"""
from .attachments import attach_volume, detach_volume, volume_mount_changed
from .reports import announce_classes, report_usage
from .steps import delete_step, delete_volume, provision_step, provision_volume
from .volumes import create_volume, destroy_volume, refused, resize_volume, set_quota

__all__ = ["announce_classes", "attach_volume", "create_volume", "delete_step", "delete_volume", "destroy_volume",
           "detach_volume", "provision_step", "provision_volume", "refused", "report_usage", "resize_volume",
           "set_quota", "volume_mount_changed"]
