"""Billing: price lists, usage, FOCUS exports, invoices, budgets and spend caps."""
