"""The engine model (``model``: what an SGLang replica charges, advanced analytically;
``prefix_cache``, ``tokens``) and the simulated replica that serves it over SGLang's
HTTP API (``server``: ``queue-rollout sim-engine``)."""
