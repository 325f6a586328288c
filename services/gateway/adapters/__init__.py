"""asyncpg repositories of the gateway's schema (the caller owns the transaction)."""
