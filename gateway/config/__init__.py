"""The YAML configuration: a marked-YAML toolkit, the loader and one module per section."""
