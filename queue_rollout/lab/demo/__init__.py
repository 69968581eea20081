"""``queue-rollout demo``: both admission modes through the real stack (``stack``) or,
with ``--virtual``, the reference shape in virtual time (``virtual``)."""
