"""HTTP plumbing shared by the handlers: authentication, problem documents, input parsing, server-sent events,
the endpoint type and the OpenAPI generator, telemetry, the typed application state, and the request/response
models (``schemas``)."""
