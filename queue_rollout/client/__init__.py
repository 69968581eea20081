"""The trainer's side: :class:`~queue_rollout.client.rollout.RolloutClient` and the
prompt validation it shares with ``queue-rollout submit`` (``prompts``)."""
