"""Compute backends: plain functions on tensors, no engine knowledge.

``reference`` holds the torch twins (one broadcast or cuBLAS call per op) that every fast kernel
is checked against.
"""
