"""The HTTP edge: the Starlette app, its OpenAPI document, uvicorn's protocol tweaks and the problem format."""
