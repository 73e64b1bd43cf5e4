"""Test doubles that ship with deferdump: stores and devices whose timing a test or a trace decides.

They are real implementations of the interfaces (no mocks), but they never finish work on their own, so
they belong in property tests, conformance replays and benchmarks, never in a deployment.
"""
