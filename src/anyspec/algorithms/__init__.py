"""Speculative decoding algorithms as plain functions on tensors."""
