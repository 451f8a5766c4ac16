"""Integrations of anyspec's vocabulary bridge into other inference engines."""
