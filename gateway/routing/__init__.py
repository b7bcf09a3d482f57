"""Which document goes where (routes) and who may send it (partners and their keys)."""
