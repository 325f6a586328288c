"""Allocations: create, list and release them, their power actions, console, events, guests and volumes."""
