"""GPU-pinned episode workers, imported as ``queue_rollout.workers``.

``supervisor`` (``queue-rollout worker``: one per GPU, its episode processes restarted
when they die, the replica watched, controls followed), ``rq_worker`` (the RQ worker
that runs only :data:`queue_rollout.ledger.keys.EPISODE_JOB_FUNC` jobs), ``episode``
(one attempt: claim, lease, generate, report), ``resolver`` (settles the replica's
doubtful attempts on its node) and ``workflows`` (what one episode does).
"""
