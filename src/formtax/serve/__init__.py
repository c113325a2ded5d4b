"""``formtax serve``: an OpenAI-compatible HTTP server (needs the ``serve`` extra: FastAPI and uvicorn)."""
