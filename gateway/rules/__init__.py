"""Business rules: ISO Schematron compiled to XSLT 3.0 and run by worker processes."""
