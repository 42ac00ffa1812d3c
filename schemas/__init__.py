"""prism.schemas: layout maths and every file format prism writes, declared once."""
