"""The pure half of the node's tenant-network dataplane: no I/O anywhere in this package.

model     the kernel objects a node should hold (``desired_state``), each with a fingerprint
names     names, addresses and fingerprints of those objects
render    the nftables text of the anti-spoofing and router tables
reconcile ``plan``: the repairs that turn what is there into what is desired

The kernel side (links, namespaces, nft, reading them back, carrying out a plan) is
``services.node_agent.adapters.dataplane``.
"""
