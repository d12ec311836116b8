"""Benchmarks: llamad's core, side by side with what a user would use instead."""
