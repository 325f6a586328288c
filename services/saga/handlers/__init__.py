"""The coordinator's handlers: the sagas themselves (sagas.py: start, replies, passed deadlines, the tenants'
lines), the places told to requests waiting in those lines (places.py), and a tenant's release of an allocation
before its saga started (withdrawals.py); the answer to a read of an allocation's sagas (timeline.py).
bootstrap.py wires them; nothing here connects."""
from .places import tell_moved_lines
from .sagas import apply, expire_due, fill_short_lines, on_reply, start_allocate, start_release, start_reschedule
from .timeline import read_steps
from .withdrawals import withdraw

__all__ = ["apply", "expire_due", "fill_short_lines", "on_reply", "read_steps", "start_allocate", "start_release",
           "start_reschedule", "tell_moved_lines", "withdraw"]
