"""Tooling around the platform — imported by no service: the runner that starts the platform
(``platform``), embedded NATS and PostgreSQL servers (``embedded``), the CLI behind ``./taskw up``
and ``demo`` (``cli``), an HTTP client of the gateway (``client``) and the AsyncAPI generator
(``asyncapi``). The runtime kit every service imports is ``shared/``."""
