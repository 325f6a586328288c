"""The HTTP API, one package per thing a user manages (allocations, inventory, networks, storage, billing, identity,
policies, limits, audit, ops). Each module holding routes has its ``ENDPOINTS``; entrypoints/http.py gathers them
into the route table. A slice imports the gateway's lower layer (http/, domain/, adapters/, settings, contracts)
and other services' contracts, never another slice."""
