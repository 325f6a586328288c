"""HTTP plumbing shared by the handlers: authentication, problem documents (``lowlevel``: also for requests aiohttp
cannot parse), input parsing, server-sent events, the endpoint type and the OpenAPI generator, telemetry, the typed
application state, and the request/response models (``schemas``)."""
