"""The workloads the lab runs: each a :class:`~.profile.Profile`, a prompt manifest
and optionally a shape and scale of its own (``profile``); the synthetic pilots
(``pilots``), the seed's modelled workloads (``seed``, drawn by ``agentic`` and
``thinking``), and every pilot by name (``registry``). The bench runs them through the
real stack; ``queue-rollout plan`` runs them in the ideal schedule."""
