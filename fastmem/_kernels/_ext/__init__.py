"""Compiled kernels (private). Use them through ``fastmem._kernels``."""
