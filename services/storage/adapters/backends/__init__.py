"""Storage backends by name (issue 13 groundwork, not wired into the service yet): ``btrfs`` (real: a subvolume
per volume with a qgroup limit) and the rendering drivers ``lustre``, ``vast`` and ``weka`` (the exact calls those
systems would receive, recorded). See ``base`` for the interface."""
