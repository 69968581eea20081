"""The SGLang client against canned responses in SGLang's documented shapes
(0.5.10 / 0.5.23 wheels, see workers/SGLANG_API.md)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from queue_rollout.engines.base import DuplicateRid, EngineError
from queue_rollout.engines.sglang import SGLangClient

GENERATE_OK = {
    "text": " The answer is \\boxed{4}",
    "output_ids": [578, 4320, 374, 220],
    "meta_info": {
        "id": "a1", "finish_reason": {"type": "stop", "matched": 151645},
        "prompt_tokens": 12, "completion_tokens": 4, "cached_tokens": 0,
        "weight_version": "7", "e2e_latency": 0.12,
        "output_token_logprobs": [[-0.1, 578, None], [-0.5, 4320, None],
                                  [-0.01, 374, None], [-2.0, 220, None]],
    },
}
ABORTED_IN_QUEUE = {"text": "", "output_ids": [], "meta_info": {
    "id": "a2", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
    "completion_tokens": 0, "weight_version": "7", "e2e_latency": 0.01}}


class Canned(BaseHTTPRequestHandler):
    replies: ClassVar[dict[str, tuple[int, object]]] = {}
    seen: ClassVar[list[tuple[str, dict]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.seen.append((self.path, body))
        key = body.get("rid", self.path) if self.path == "/generate" else self.path
        status, reply = self.replies[key]
        data = b"" if reply is None else json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canned():
    server = HTTPServer(("127.0.0.1", 0), Canned)
    Canned.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_parses_the_documented_generate_response(canned):
    Canned.replies = {"a1": (200, GENERATE_OK)}
    gen = SGLangClient(canned).generate("a1", input_ids=[1, 2], timeout=5, sampling_params={
        "max_new_tokens": 8, "sampling_seed": 3})
    assert gen.text.endswith("\\boxed{4}") and gen.output_ids == [578, 4320, 374, 220]
    assert gen.logprobs == [-0.1, -0.5, -0.01, -2.0]
    assert gen.finish_reason["type"] == "stop" and not gen.aborted
    assert (gen.completion_tokens, gen.prompt_tokens, gen.weight_version) == (4, 12, "7")
    path, body = Canned.seen[0]
    assert path == "/generate" and body["rid"] == "a1" and body["return_logprob"] is True
    assert body["sampling_params"] == {"max_new_tokens": 8, "sampling_seed": 3}


def test_an_abort_in_the_waiting_queue_lacks_prompt_tokens(canned):
    Canned.replies = {"a2": (200, ABORTED_IN_QUEUE)}
    gen = SGLangClient(canned).generate("a2", text="hi", sampling_params={}, timeout=5)
    assert gen.aborted and gen.prompt_tokens is None and gen.output_ids == []


@pytest.mark.parametrize("message", ["Duplicate request IDs detected: ['d']",  # 0.5.10
                                     "Duplicate request ID detected: d"])       # 0.5.23
def test_duplicate_rid_in_both_wordings(canned, message):
    Canned.replies = {"d": (400, {"error": {"message": message}})}
    with pytest.raises(DuplicateRid):
        SGLangClient(canned).generate("d", input_ids=[1], sampling_params={}, timeout=5)


def test_error_bodies_of_both_shapes_are_reported(canned):
    Canned.replies = {"u": (400, {"error": "unknown field `seed`, expected one of ..."}),
                      "/update_weights_from_disk": (400, {"success": False, "message": "bad"})}
    client = SGLangClient(canned)
    with pytest.raises(EngineError, match="unknown field `seed`"):
        client.generate("u", input_ids=[1], sampling_params={"seed": 1}, timeout=5)
    with pytest.raises(EngineError, match=r"HTTP 400 bad$"):  # the message, not the body
        client.update_weights_from_disk("/m", weight_version="2")


def test_abort_and_pause_send_sglang_bodies(canned):
    Canned.replies = {"/abort_request": (200, None),
                      "/pause_generation": (200, {"message": "ok", "status": "ok"}),
                      "/continue_generation": (200, {"message": "ok", "status": "ok"})}
    client = SGLangClient(canned)
    client.abort("x")
    client.pause("in_place")
    client.resume()
    assert Canned.seen == [("/abort_request", {"rid": "x"}),
                           ("/pause_generation", {"mode": "in_place"}),
                           ("/continue_generation", {})]
