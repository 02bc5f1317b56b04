"""The package version (its own module, so that modules inside the package never import the package root)."""

__version__ = "0.1.0"
