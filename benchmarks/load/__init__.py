"""Load generation against a running server (closed and open loop) and its statistics."""
