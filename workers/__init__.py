"""GPU-pinned episode workers (installed as ``queue_rollout.workers``).

The RQ worker, the SGLang client, the built-in workflows and the simulated replica
arrive with issue [2/7]; the ledger already enqueues episode jobs for
:data:`queue_rollout.keys.EPISODE_JOB_FUNC`.
"""
