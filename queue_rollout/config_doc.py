"""The configuration reference, generated from the config structs.

``python -m queue_rollout.config_doc en > docs/en/config-reference.md`` (and ``zh``).
Keys, types, constraints and defaults come from :mod:`queue_rollout.config` itself; the
one-line meanings live here, in both languages, and a test fails when a key has none
or when the pages in ``docs/`` differ from what this prints.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec

from queue_rollout.config import Config

#: "section.key" -> (English, Chinese)
MEANINGS: dict[str, tuple[str, str]] = {
    "farm.name": ("The farm's name; every Redis key is `qr:{name}:...`.",
                  "集群名；所有 Redis 键都是 `qr:{name}:...`。"),
    "farm.redis_url": ("Redis URL (`redis://`, `rediss://`, user and password allowed), or "
                       "Sentinel's `redis+sentinel://[user:pw@]host:port[,host:port...]/service`; "
                       "empty: the embedded redis-server of `up`/`demo`, found through "
                       "`state_dir`.",
                       "Redis URL（可用 `redis://`、`rediss://`、用户名和密码），或 Sentinel 的 "
                       "`redis+sentinel://[user:pw@]host:port[,host:port...]/service`；为空时使用 "
                       "`up`/`demo` 的内嵌 redis-server，经 `state_dir` 找到。"),
    "farm.state_dir": ("Local folder for the embedded Redis, `redis.url`, node logs and boot ids.",
                       "本地目录：内嵌 Redis、`redis.url`、node 日志与 boot id。"),
    "farm.redis_ca_file": ("CA certificate file for `rediss://` URLs.",
                           "`rediss://` URL 所用的 CA 证书文件。"),
    "farm.sentinel_password": ("The Sentinels' own password (`requirepass` on their port), "
                               "for a `redis+sentinel://` URL; the URL's password is the data "
                               "nodes'.",
                               "Sentinel 自身的密码（其端口上的 `requirepass`），用于 "
                               "`redis+sentinel://` URL；URL 中的密码是数据节点的。"),
    "farm.redis_wait_replicas": ("N: after every ledger change, wait until N replicas hold it "
                                 "(`WAIT`) before acting on it; 0: do not wait (a failover may "
                                 "lose the last writes).",
                                 "N：每次账本变更后，等 N 个副本确认持有（`WAIT`）再据此行动；"
                                 "0：不等待（故障切换可能丢失最后几次写入）。"),
    "rollout.group_size": ("G: episodes per prompt group.", "G：每个提示组的 episode 数。"),
    "rollout.batch_size": ("B: groups per trainer batch.", "B：每个训练批次的组数。"),
    "rollout.max_concurrent_rollouts": (
        "Group admission: groups in flight at once (capacity = this x G slots).",
        "组级准入：同时在途的组数（容量 = 该值 x G 个槽位）。"),
    "rollout.max_concurrent_samples": (
        "Set it to opt into sample-level refill: capacity in episode slots, or \"auto\" for "
        "the live workers' slots. Unset: group admission.",
        "设置即启用样本级补位：以 episode 槽位计的容量，或 \"auto\"（在线 worker 的槽位和）。"
        "不设：组级准入。"),
    "rollout.max_staleness": ("Staleness budget: accepted and in-flight groups stay within "
                              "(max_staleness + 1) x B of the groups the trainer had "
                              "consumed when it last set the version.",
                              "陈旧度预算：已接受与在途的组数，不超过训练器上次设置版本时"
                              "已消费组数再加 (max_staleness + 1) x B。"),
    "rollout.max_attempts": ("Attempts per episode before it fails (lost attempts count).",
                             "每个 episode 的最多尝试次数，超过即失败（lost 的尝试也计入）。"),
    "rollout.placement": (
        "\"group\": a group's attempts go to one replica with G free slots (else as few "
        "replicas as possible), so its prompt is computed there once per prefill batch; "
        "\"any\": any worker takes any attempt.",
        "\"group\"：一组的尝试放到一个有 G 个空闲槽位的副本上（否则尽量少的副本），"
        "提示在那里每个 prefill 批次只计算一次；\"any\"：任何 worker 取任何尝试。"),
    "rollout.placement_wait_s": (
        "Placement: seconds an attempt placed on a replica may wait there before it moves "
        "to the shared queue (it moves at once when the replica's worker is gone).",
        "放置：放到某副本上的尝试在那里最多等待的秒数，超时移入共享队列"
        "（该副本的 worker 消失时立即移走）。"),
    "timeouts.lease": ("Seconds a running attempt's lease lasts; renewed every lease/3.",
                       "运行中尝试的租约秒数；每 lease/3 续约一次。"),
    "timeouts.doubt": ("Seconds an attempt may stay doubtful before it is declared lost and "
                       "retried.", "尝试处于存疑状态的最长秒数，之后判为 lost 并重试。"),
    "timeouts.request": ("Seconds one `/generate` call may take.",
                         "一次 `/generate` 调用的最长秒数。"),
    "timeouts.pause_barrier": ("Seconds `pause()` waits for every live worker to confirm.",
                               "`pause()` 等待所有在线 worker 确认的最长秒数。"),
    "timeouts.leader_lease": ("Seconds of collector leadership; a standby takes over after it.",
                              "收集器领导权的秒数；过期后由备用收集器接管。"),
    "timeouts.shutdown_grace": ("SIGTERM: seconds running episodes may still finish.",
                                "SIGTERM：运行中的 episode 还可完成的秒数。"),
    "timeouts.redis_wait": ("Seconds one `WAIT` for `farm.redis_wait_replicas` may take before "
                            "the change is sent again.",
                            "等待 `farm.redis_wait_replicas` 的一次 `WAIT` 最长秒数，"
                            "超时即重发该变更。"),
    "timeouts.batch_ack": ("Seconds a delivered batch may stay unacknowledged; then the "
                           "collector releases it: its groups go to the next consumer that "
                           "takes a batch, and a late ack of it is refused. 0: never.",
                           "已交付的批次最多可保持未确认的秒数；超时后收集器释放它：其中的组"
                           "交给下一个取批次的消费者，迟到的确认会被拒绝。0：从不释放。"),
    "acceptance.reject_zero_variance": ("Reject groups whose members all got the same reward.",
                                        "拒绝所有成员奖励相同的组。"),
    "acceptance.max_failed_members": ("Failed members a group may have and still be accepted.",
                                      "组内允许失败的成员数，仍可被接受。"),
    "acceptance.plugin": ("`package.module:function(group)`: True, or a reason string to "
                          "reject.",
                          "`package.module:function(group)`：返回 True，或拒绝原因字符串。"),
    "workflow.name": ("Episode workflow: `controlled_length`, `controlled_turns`, "
                      "`generate`, `math`, `noop` or `package.module:factory`.",
                      "episode 工作流：`controlled_length`、`controlled_turns`、`generate`、"
                      "`math`、`noop` 或 `package.module:factory`。"),
    "workflow.seed": ("Run seed; an episode's sampling seed derives from (seed, prompt id, "
                      "member).", "运行种子；episode 的采样种子由 (seed, 提示 id, 成员) 派生。"),
    "workflow.sampling.temperature": ("SGLang sampling temperature.", "SGLang 采样温度。"),
    "workflow.sampling.top_p": ("SGLang nucleus sampling.", "SGLang nucleus 采样。"),
    "workflow.sampling.max_new_tokens": ("Generation budget per call.", "每次调用的生成上限。"),
    "workflow.sampling.top_k": ("SGLang top-k.", "SGLang top-k。"),
    "workflow.sampling.min_p": ("SGLang min-p.", "SGLang min-p。"),
    "workflow.sampling.min_new_tokens": ("SGLang minimum new tokens.", "SGLang 最少新 token 数。"),
    "workflow.sampling.frequency_penalty": ("SGLang frequency penalty.", "SGLang 频率惩罚。"),
    "workflow.sampling.presence_penalty": ("SGLang presence penalty.", "SGLang 存在惩罚。"),
    "workflow.sampling.repetition_penalty": ("SGLang repetition penalty.", "SGLang 重复惩罚。"),
    "workflow.sampling.stop": ("Stop strings.", "停止字符串。"),
    "workflow.sampling.stop_token_ids": ("Stop token ids.", "停止 token id。"),
    "workflow.sampling.ignore_eos": ("Keep generating past EOS.", "越过 EOS 继续生成。"),
    "workflow.sampling.skip_special_tokens": ("Drop special tokens from the text.",
                                              "文本中去掉特殊 token。"),
    "workflow.sampling.no_stop_trim": ("Keep the stop string in the text.",
                                       "文本中保留停止字符串。"),
    "engine.kind": ("`sim` (simulated replicas) or `sglang`.", "`sim`（模拟副本）或 `sglang`。"),
    "engine.urls": ("`up` with sglang: the replicas' URLs.", "`up` 使用 sglang 时：各副本的 URL。"),
    "engine.replicas": ("`up` with sim: replicas to start.", "`up` 使用 sim 时：启动的副本数。"),
    "engine.slots_per_replica": ("Concurrent episodes per replica / GPU (SGLang's "
                                 "`--max-running-requests`).",
                                 "每个副本 / GPU 的并发 episode 数（SGLang 的 "
                                 "`--max-running-requests`）。"),
    "engine.threads_per_process": ("A worker's episode slots per process, as threads (1: a "
                                   "process per slot).",
                                   "worker 每个进程中的 episode 槽位数，以线程运行"
                                   "（1：每槽位一个进程）。"),
    "engine.step_ms": ("sim: decode step time with one running request (ms).",
                       "sim：单个运行请求时的解码步时长（毫秒）。"),
    "engine.step_ms_per_request": ("sim: added to the step per running request (ms).",
                                   "sim：每多一个运行请求，步时长增加的毫秒数。"),
    "engine.prefill_tokens_per_s": (
        "sim: uncached context tokens computed per second; prefill stalls decode.",
        "sim：每秒计算的未缓存上下文 token 数；prefill 期间解码暂停。"),
    "engine.chunked_prefill_size": (
        "sim: most tokens in one prefill round (SGLang's `--chunked-prefill-size`).",
        "sim：一轮 prefill 最多的 token 数（SGLang 的 `--chunked-prefill-size`）。"),
    "engine.max_total_tokens": (
        "sim: KV pool in tokens, shared by running requests and the prefix cache "
        "(SGLang's `--max-total-tokens`); at least one chunk.",
        "sim：KV 池的 token 数，由运行中的请求与前缀缓存共用（SGLang 的 "
        "`--max-total-tokens`）；至少一个 chunk。"),
    "engine.pause_mode": ("How a pause stops generation: `in_place` (KV kept), `abort` "
                          "(partial rollout resumed under the new weights; its context "
                          "cached) or `retract` (KV freed, recomputed on resume).",
                          "暂停的方式：`in_place`（保留 KV）、`abort`（部分 rollout 在新权重下"
                          "续跑；其上下文进入缓存）或 `retract`（释放 KV，恢复时重算）。"),
    "engine.adaptive_slots": (
        "true: each worker reads its replica's `/metrics` and sets how many of its slots "
        "take new jobs (halved on a retraction or a token usage above 0.90, one more a "
        "look while there is room); its registered slots, and `\"auto\"` capacity, "
        "follow.",
        "true：每个 worker 读取其副本的 `/metrics`，设定有多少槽位接新任务（发生 retraction "
        "或 token 使用率高于 0.90 时减半，有余量时每次加一）；其登记的槽位数以及 "
        "`\"auto\"` 容量随之变化。"),
    "engine.min_slots_per_replica": (
        "Adaptive slots: the lowest limit a worker sets (the highest is "
        "`slots_per_replica`); at most `slots_per_replica`.",
        "自适应槽位：worker 设定的最低上限（最高为 `slots_per_replica`）；不得超过 "
        "`slots_per_replica`。"),
    "engine.adaptive_interval_s": (
        "Adaptive slots: seconds between a worker's looks at its replica's `/metrics`.",
        "自适应槽位：worker 两次读取其副本 `/metrics` 之间的秒数。"),
    "engine.model_path": ("`node` with sglang: the model to serve.",
                          "`node` 使用 sglang 时：要服务的模型。"),
    "engine.python": ("`node` with sglang: the Python that has SGLang and runs the replicas; "
                      "empty: the environment variable `QUEUE_ROLLOUT_SGLANG_PYTHON`, else "
                      "the Python of `queue-rollout` itself. `node` refuses to start when it "
                      "cannot import `sglang`.",
                      "`node` 使用 sglang 时：装有 SGLang、用来运行副本的 Python；为空时取环境变量 "
                      "`QUEUE_ROLLOUT_SGLANG_PYTHON`，再不然取 `queue-rollout` 自身的 Python。"
                      "它无法导入 `sglang` 时 `node` 拒绝启动。"),
    "engine.base_port": ("`node`: replica i listens on base_port + i.",
                         "`node`：第 i 个副本监听 base_port + i。"),
    "engine.deterministic": ("`node`: pass `--enable-deterministic-inference` (a retry "
                             "reproduces its episode). A CPU server (`--device cpu`) refuses "
                             "it: set false there.",
                             "`node`：传入 `--enable-deterministic-inference`"
                             "（重试可复现 episode）。CPU 服务器（`--device cpu`）不接受它："
                             "此时设为 false。"),
    "engine.sglang_args": ("`node`: extra SGLang launch arguments, passed through; with "
                           "`--device cpu` the replicas also get `SGLANG_USE_CPU_ENGINE=1`.",
                           "`node`：额外的 SGLang 启动参数，原样传递；含 `--device cpu` 时副本还会"
                           "得到环境变量 `SGLANG_USE_CPU_ENGINE=1`。"),
    "collector.step_ms": ("The collector's round (admission, the outbox, judgement, the "
                          "reconciler) runs this often (ms). Lower it only for a farm whose "
                          "episodes take well under a second (the benchmarks scale it with "
                          "time).",
                          "收集器每隔这么久（毫秒）运行一轮（准入、outbox、评判、对账器）。"
                          "只有当 episode 远短于一秒时才需要调低（基准测试按时间比例缩放它）。"),
    "limits.max_prompt_bytes": ("Largest prompt accepted (bytes of JSON).",
                                "可接受的最大提示（JSON 字节数）。"),
    "limits.max_result_bytes": ("Largest episode result; a larger one fails its episode.",
                                "最大 episode 结果；超过则该 episode 失败。"),
    "limits.max_turns": ("Most turns of one member in a prompt's `member_turns` "
                         "(`controlled_turns`); a longer member refuses the prompt.",
                         "提示的 `member_turns` 中一个成员的最多轮数（`controlled_turns`）；"
                         "超过则拒绝该提示。"),
    "metrics.host": ("Address the metrics endpoint binds.", "指标端点绑定的地址。"),
    "metrics.port": ("Port of `/metrics` and `/healthz`.", "`/metrics` 与 `/healthz` 的端口。"),
    "history.max_groups": ("Groups whose story `trace` can tell (admission, each attempt, "
                           "judgement, batch, ack): the last this many admitted; the oldest "
                           "beyond leave. 0: no history is kept.",
                           "`trace` 能讲述其经过（准入、每次尝试、评判、批次、确认）的组数："
                           "最近准入的这么多组；更早的被移除。0：不保留历史。"),
    "history.ttl_s": ("Seconds a group's story is kept after its admission.",
                      "组的经过在其准入后保留的秒数。"),
}

TITLE = {"en": ("Configuration reference", "key", "type", "default", "meaning",
                "Generated from the config structs by `python -m queue_rollout.config_doc en`; "
                "unknown keys are refused. See [Configuration](configuration.md) for the file "
                "as a whole."),
         "zh": ("配置参考", "键", "类型", "默认值", "含义",
                "由 `python -m queue_rollout.config_doc zh` 从配置结构体生成；未知键会被拒绝。"
                "整体说明见[配置](configuration.md)。")}


def _type(t: Any) -> str:
    """A type with its constraints, e.g. ``int > 0``, ``int > 0 | "auto" | unset``."""
    if isinstance(t, msgspec.inspect.UnionType):
        return " \\| ".join(_type(x) for x in t.types)
    if isinstance(t, msgspec.inspect.NoneType):
        return "unset"
    if isinstance(t, msgspec.inspect.LiteralType):
        return " \\| ".join(json.dumps(v) for v in t.values)
    if isinstance(t, msgspec.inspect.ListType):
        return f"list of {_type(t.item_type)}"
    names: dict[type[msgspec.inspect.Type], str] = {
        msgspec.inspect.IntType: "int", msgspec.inspect.FloatType: "float",
        msgspec.inspect.StrType: "string", msgspec.inspect.BoolType: "bool"}
    name = names.get(type(t))
    if name is None:
        return type(t).__name__
    bounds = [f"{op} {getattr(t, attr)}" for attr, op in
              (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
              if getattr(t, attr, None) is not None]
    if getattr(t, "pattern", None):
        bounds.append("matching `" + t.pattern.replace("|", "\\|") + "`")
    return " ".join([name, ", ".join(bounds)]).strip()


def _default(field: Any) -> str:
    if field.default is msgspec.NODEFAULT:
        value = field.default_factory()
        if isinstance(value, msgspec.Struct):
            return ""
    else:
        value = field.default
    return "unset" if value is None else f"`{json.dumps(value, ensure_ascii=False)}`"


def sections(struct: type = Config, prefix: str = "") -> list[tuple[str, list[tuple[str, Any]]]]:
    """(section name, [(key, field)]) for every TOML table, nested ones after."""
    own, nested = [], []
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType), struct
    for field in info.fields:
        if isinstance(field.type, msgspec.inspect.StructType):
            nested += sections(field.type.cls, f"{prefix}{field.name}.")
        else:
            own.append((f"{prefix}{field.name}", field))
    return ([(prefix.rstrip("."), own)] if own else []) + nested


def reference_markdown(lang: str) -> str:
    title, key_h, type_h, default_h, meaning_h, intro = TITLE[lang]
    index = 0 if lang == "en" else 1
    lines = [f"# {title}", "", intro, ""]
    for name, fields in sections():
        lines += [f"## [{name}]", "", f"| {key_h} | {type_h} | {default_h} | {meaning_h} |",
                  "|---|---|---|---|"]
        for key, field in fields:
            short = key.rsplit(".", 1)[-1]
            lines.append(f"| `{short}` | {_type(field.type)} | {_default(field)} | "
                         f"{MEANINGS[key][index]} |")
        lines.append("")
    return "\n".join(lines)


def undocumented() -> list[str]:
    keys = [key for _, fields in sections() for key, _ in fields]
    return [k for k in keys if k not in MEANINGS]


if __name__ == "__main__":
    sys.stdout.write(reference_markdown(sys.argv[1] if len(sys.argv) > 1 else "en"))
