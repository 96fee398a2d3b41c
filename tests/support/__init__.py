"""Shared test support: builders, harnesses and helpers the tests import."""
