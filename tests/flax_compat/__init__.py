"""Flax's own tests for the logical-partitioning API (adapted: imports and names only), run against the toolkit;
plus test_differences.py, which pins where the toolkit deliberately differs."""
