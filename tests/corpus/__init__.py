"""Hostile-input corpora: each case is an input plus the outcome it must produce, asserted by tests."""
