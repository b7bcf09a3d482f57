"""Taking a document in: the body read safely, parsed, checked against its schema, and explained when invalid."""
