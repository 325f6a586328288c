"""Policies: the Cedar policies that judge mutating requests."""
