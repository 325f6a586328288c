"""Network's handlers, each (context, message) -> effect within the consumer's transaction.

attachments  saga steps: attach an allocation to a tenant network, detach it (undo)
management   tenant commands: create/delete networks, add/remove security rules
ports        saga steps: a bare-metal server's switch port onto its tenant network (bind), back (unbind)
leaves       an attachment arriving on / leaving its leaf (shared by attachments and ports)
tenancy      what both share: provisioning from the pools, tenant snapshots, releases
"""
from .attachments import attach_network, detach_network
from .management import add_security_rule, create_network, delete_network, refused, remove_security_rule
from .ports import bind_port, unbind_port

__all__ = ["add_security_rule", "attach_network", "bind_port", "create_network", "delete_network", "detach_network",
           "refused", "remove_security_rule", "unbind_port"]
