"""The libvirt driver: one QEMU domain per slot allocation (libvirt-python imported lazily, blocking calls off the event loop)."""
