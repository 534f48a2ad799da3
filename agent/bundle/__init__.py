"""Signed policy bundles (issue #32): the one-file format, its scope over host facts, verification and install."""
