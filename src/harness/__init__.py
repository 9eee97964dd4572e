"""Harness: case grammar, checking, tolerances, timing, ceilings, tables, runs and the CLI."""
