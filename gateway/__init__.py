"""B2B XML integration gateway."""
