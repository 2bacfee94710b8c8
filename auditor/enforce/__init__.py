"""Graduated enforcement: nudge, escalate, act on allocations idle for too long; exemptions."""
