"""The virtual-time farm: the real ledger scripts on a real Redis with a clock moved by
hand (``clock``), and the replicas' timing model advanced between events (``farm``).
``demo --virtual`` and the bench's ideal schedule run on it."""
