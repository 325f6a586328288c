"""Operator views: dead letters and the live bus."""
