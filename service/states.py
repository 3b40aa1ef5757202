"""Kept for existing imports: the lifecycle (states, transitions, guards) lives in `service.lifecycle`."""

from service.lifecycle import TERMINAL, IllegalTransitionError, State, check_transition

__all__ = ["TERMINAL", "IllegalTransitionError", "State", "check_transition"]
