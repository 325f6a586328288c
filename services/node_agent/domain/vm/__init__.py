"""A VM slice as libvirt and cloud-init see it: the domain XML and the NoCloud seed documents. Pure: no I/O."""
