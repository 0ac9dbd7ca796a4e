"""The OpenAI-compatible HTTP API over a policy: `create_app`, and `inprocess_client` for the
trainer and tests (the same code path as a remote agent, without a port)."""
