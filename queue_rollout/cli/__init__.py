"""The ``queue-rollout`` command line (``main``) and the commands that run processes:
``demo`` (the real stack), ``demo --virtual``, ``up`` and ``node``."""
