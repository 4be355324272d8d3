"""The built-in job families, one package each. ``tasks/registry.py`` finds them; none imports it."""
