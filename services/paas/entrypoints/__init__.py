"""How the PaaS service is reached: its subscriptions (bus.py) and what it does on its own (loops.py)."""
