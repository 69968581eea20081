"""``queue-rollout plan``: the virtual-time farm as a planning tool."""
