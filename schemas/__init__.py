"""prism.schemas: layout maths and every file format prism writes, declared once."""

PRISM_VERSION = "0.1.0"
"""Version written into captures and graphs (keep equal to pyproject.toml)."""
