"""`tessera`: the command-line client of Tessera's public HTTP API.

It speaks only HTTP (the standard library's client) and never imports the services, the runtime kit or the
project's tooling: what it can do, any client of the API can do."""
