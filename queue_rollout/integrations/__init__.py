"""The farm inside RL frameworks' trainers: :mod:`queue_rollout.integrations.trl` (TRL's
``GRPOTrainer``). Each module imports its framework; ``import queue_rollout`` imports
none of them."""
