"""Helpers shared by the test suite (plain modules, not tests): import them from here, never from a test module.

polling      eventually(): the one way a test waits for something (always bounded)
bus          envelopes, publishing commands and events, StreamWatcher, waiting for a consumer
commands     the step commands the saga sends, as several test modules build them
concurrency  run_concurrently(): N callers at once, each on a database connection of its own
scheduler    the scheduler started for a test (Env, start)
network      the network service driven over the bus (Net)
gateway      the gateway's HTTP client and harness helpers (the fixtures are in tests/integration/conftest.py)
platform     the whole platform's settings and checks shared by the e2e and chaos tests
"""
