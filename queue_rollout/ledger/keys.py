"""Every Redis key name queue-rollout uses, built from the farm name.

Farm keys carry the farm as a Redis Cluster hash tag (``qr:{demo}:counters``), so every
ledger script touches keys of one slot but one: ``move.lua`` also takes two RQ queues
(``rq:queue:qr-<farm>-episodes`` and a worker's), RQ's own keys, which carry no hash
tag. On Redis Cluster they would sit in other slots; giving them the farm's tag renames
the queues every running worker reads, a migration left for the day the farm runs on a
cluster. Every other script runs there as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The function an episode job stands for (jobs enqueued by earlier releases name it).
#: The episode worker runs the attempt a job's id names and never imports what a job
#: names, so this stays importable for those jobs' sake and for RQ's tools.
EPISODE_JOB_FUNC = "queue_rollout.workers.episode.run_attempt"
#: Consumer group of the collector on the events stream.
EVENTS_GROUP = "collector"


@dataclass(frozen=True)
class Keys:
    farm: str
    prefix: str = field(init=False)

    def __post_init__(self) -> None:
        if not self.farm or any(c in self.farm for c in "{}: \t\n"):
            raise ValueError(f"farm name {self.farm!r} cannot be used in a key")
        object.__setattr__(self, "prefix", f"qr:{{{self.farm}}}:")

    def _k(self, name: str) -> str:
        return self.prefix + name

    # Scalars
    @property
    def counters(self) -> str:
        """Hash of ledger counters (reserved, running, in_flight, accepted, ...)."""
        return self._k("counters")

    @property
    def state(self) -> str:
        """Hash: policy ``version``, ``paused`` flag."""
        return self._k("state")

    # Work
    @property
    def pending(self) -> str:
        """List of submitted prompt ids not yet admitted (FIFO)."""
        return self._k("pending")

    @property
    def prompts(self) -> str:
        """Hash prompt id -> prompt JSON."""
        return self._k("prompts")

    @property
    def groups(self) -> str:
        """Hash group id (= prompt id) -> group record JSON."""
        return self._k("groups")

    @property
    def attempts(self) -> str:
        """Hash attempt id -> attempt record JSON."""
        return self._k("attempts")

    @property
    def results(self) -> str:
        """Hash ``gid/member`` -> encoded episode result."""
        return self._k("results")

    @property
    def shape_parts(self) -> str:
        """Hash ``gid/member`` -> a finished member's shape, until its group completes."""
        return self._k("shape_parts")

    @property
    def shapes(self) -> str:
        """Capped list of completed groups' shapes, newest first (``plan --from-farm``)."""
        return self._k("shapes")

    @property
    def outbox(self) -> str:
        """List of attempts whose RQ job is still to be enqueued, as ``aid@worker`` (its
        worker's queue) or ``aid@`` (the shared one); see :mod:`.jobs`."""
        return self._k("outbox")

    @property
    def placed(self) -> str:
        """Sorted set queued attempt id -> when it was placed on a replica's queue
        (``rollout.placement = "group"``)."""
        return self._k("placed")

    @property
    def replica_slots(self) -> str:
        """Hash worker id -> its slots, for each worker admission may place on (the
        live workers, as the reconciler last saw them)."""
        return self._k("replica_slots")

    @property
    def replica_load(self) -> str:
        """Hash worker id -> attempts placed on its queue plus attempts it runs (or ran,
        while in doubt), for a farm that places groups."""
        return self._k("replica_load")

    @property
    def replica_free(self) -> str:
        """Sorted set worker id -> free slots (slots - load), for each worker in
        ``replica_slots``: admission takes the replicas with the most."""
        return self._k("replica_free")

    @property
    def leases(self) -> str:
        """Sorted set running attempt id -> lease expiry."""
        return self._k("leases")

    @property
    def holders(self) -> str:
        """Sorted set lease holder (a worker process) -> lease expiry: the running
        attempts it holds live while it does."""
        return self._k("holders")

    @property
    def doubt(self) -> str:
        """Sorted set doubtful attempt id -> doubtful since."""
        return self._k("doubt")

    @property
    def events(self) -> str:
        """Stream of group completions."""
        return self._k("events")

    @property
    def ready(self) -> str:
        """List of accepted group ids waiting for a batch."""
        return self._k("ready")

    @property
    def batches(self) -> str:
        """Hash consumer id -> its unacknowledged batch JSON."""
        return self._k("batches")

    @property
    def released(self) -> str:
        """Sorted set batch id -> when it was released from its consumer (``release``),
        the last ``RELEASED_KEPT``: a late ack of one is refused as released."""
        return self._k("released")

    @property
    def history(self) -> str:
        """Hash group id -> the group's story for ``trace``: its events, one JSON object
        a line, oldest first (:mod:`queue_rollout.ledger.history`), for the groups in
        ``history_index``."""
        return self._k("history")

    @property
    def history_index(self) -> str:
        """Sorted set group id -> when it was admitted, of the groups ``history`` keeps:
        the last ``history.max_groups`` admitted within ``history.ttl_s``."""
        return self._k("history_index")

    @property
    def workers(self) -> str:
        """Hash worker id -> worker record JSON (host, gpu, replica, boot id, slots)."""
        return self._k("workers")

    @property
    def workers_seen(self) -> str:
        """Sorted set worker id -> last time its supervisor reported alive."""
        return self._k("workers_seen")

    @property
    def observations(self) -> str:
        """Capped stream of histogram observations (episode_s, batch_interval_s,
        rollout_interval_s, staleness, tool_s)."""
        return self._k("observations")

    @property
    def control(self) -> str:
        """Hash of trainer requests to workers: weights_epoch, weights_path, weights_version."""
        return self._k("control")

    @property
    def acks(self) -> str:
        """Hash of worker answers: ``pause:<worker>`` -> epoch, ``weights:<worker>`` ->
        ``<epoch> ok`` or ``<epoch> error: <why>``."""
        return self._k("acks")

    @property
    def wake(self) -> str:
        """Capped stream: an idle collector blocks on it (and on ``events``); submit,
        resume and set_version add an entry."""
        return self._k("wake")

    @property
    def controls_channel(self) -> str:
        """Pub/Sub channel: a message whenever the pause flag or a weight request
        changes (its content is only a hint: the listener reads the state)."""
        return self._k("controls")

    @property
    def refusals(self) -> str:
        """Hash: admission refusals of about the last minute, per reason, in 10-second
        buckets (``admit.lua`` says how)."""
        return self._k("refusals")

    @property
    def leader(self) -> str:
        """Hash: the collector holding leadership, and until when."""
        return self._k("leader")

    @property
    def shape(self) -> str:
        """String (JSON): the settings every process of the farm must share, recorded
        by the first one (see :mod:`queue_rollout.ledger.shape`)."""
        return self._k("shape")

    @property
    def rq_queue(self) -> str:
        """Name of the RQ queue episode jobs go to (RQ builds its own key from it)."""
        return f"qr-{self.farm}-episodes"

    def rq_replica_queue(self, worker: str) -> str:
        """Name of the RQ queue of attempts placed on *worker*'s replica."""
        return f"{self.rq_queue}@{worker}"

    def receipt(self, token: str) -> str:
        """String: what one ledger change answered, kept while its caller waits for
        replicas (farm.redis_wait_replicas) and deleted once they hold it."""
        return self._k(f"receipt:{token}")


def rq_queue_key(name: str) -> str:
    """The Redis list RQ keeps queue *name* in (``rq.Queue(name).key``)."""
    return f"rq:queue:{name}"


def episode_field(group_id: str, member: int) -> str:
    """Field of an episode's result in the results hash (as _lib.lua builds it)."""
    return f"{group_id}/{member}"
