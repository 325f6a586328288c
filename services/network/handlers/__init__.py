"""Network's handlers, each (context, message) -> effect within the consumer's transaction.

attachments  saga steps: attach an allocation to a tenant network, detach it (undo)
management   tenant commands: create/delete networks, add/remove security rules
tenancy      what both share: provisioning from the pools, tenant snapshots, releases
"""
from .attachments import attach_network, detach_network
from .management import add_security_rule, create_network, delete_network, refused, remove_security_rule

__all__ = ["add_security_rule", "attach_network", "create_network", "delete_network", "detach_network",
           "refused", "remove_security_rule"]
