"""Tuning for a traffic mix: every model of the server at once, on one core budget."""
