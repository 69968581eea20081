"""The farm inside RL frameworks' trainers: :mod:`queue_rollout.integrations.trl` (TRL's
``GRPOTrainer``) and :mod:`queue_rollout.integrations.areal` (an AReaL
``InferenceEngine``). Each module imports its framework; ``import queue_rollout``
imports none of them."""
