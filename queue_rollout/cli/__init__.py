"""The ``queue-rollout`` command line (``main``), above the farm and the lab: it parses
flags and hands each command to the module that runs it."""
