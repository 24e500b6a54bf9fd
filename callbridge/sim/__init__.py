"""Simulated carriers and calls, for the demo, the tests and load tests."""
