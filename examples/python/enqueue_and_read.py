#!/usr/bin/env python3
"""Enqueue one batchd job and read its result through a consumer group, with redis-py.

    REDIS_URL=redis://127.0.0.1:6379 BATCHD_NAMESPACE=batchd python3 enqueue_and_read.py [JOB_ID [PROVIDER]]

PROVIDER picks the job: `cloudflare` (the default: Workers AI, @cf/...), `openai` (OpenAI Batch, openai/...) or
`anthropic` (Anthropic Message Batches, anthropic/...). The daemon routes a job by its model name; the job, the
result entry and the reading loop are the same for every provider, only the request items differ (each is the
provider's own request body, without "model": docs/providers.md).

Prints one JSON line, {"job_id": .., "status": .., "responses": N, "succeeded": N, ...}, and exits 0 when the job
completed; exits 1 with a one-line error otherwise (or after 60 s without its result).

The reading loop is the reliable pattern from docs/producers.md: a consumer group of the application's own, its own
pending entries first after a restart (read from id 0), then entries a dead consumer left behind (XAUTOCLAIM), then
new entries (id ">"), each acknowledged (XACK) only after it was handled. Delivery is at least once, so handling
dedupes on job_id.
"""

import json
import os
import sys
import time

import redis

GROUP = "py-example"  # one consumer group per consuming application
CONSUMER = "worker-1"  # stable across restarts (a host or pod name), so a restart resumes its pending entries
CLAIM_MIN_IDLE_MS = 60_000  # entries another consumer held this long without XACK are taken over

# One sample job per provider: its model and two request items.
JOBS = {
    "cloudflare": {
        "model": "@cf/baai/bge-m3",
        "requests": [
            {"query": "What is batchd?", "contexts": [{"text": "A batch daemon."}, {"text": "A fruit."}]},
            {"text": "batchd runs Workers AI batch jobs fed through Redis"},
        ],
    },
    # Chat Completions bodies; a job may add "endpoint": "/v1/embeddings" (or "/v1/responses", ...) instead.
    "openai": {
        "model": "openai/gpt-4o-mini",
        "requests": [
            {"messages": [{"role": "user", "content": "What is batchd?"}], "max_tokens": 50},
            {"messages": [{"role": "user", "content": "Name one use of a batch API."}], "max_tokens": 50},
        ],
    },
    # Messages API bodies (max_tokens is required).
    "anthropic": {
        "model": "anthropic/claude-sonnet-4-5",
        "requests": [
            {"max_tokens": 50, "messages": [{"role": "user", "content": "What is batchd?"}]},
            {"max_tokens": 50, "messages": [{"role": "user", "content": "Name one use of a batch API."}]},
        ],
    },
}


def main() -> int:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
    namespace = os.environ.get("BATCHD_NAMESPACE", "batchd")
    job_id = sys.argv[1] if len(sys.argv) > 1 else f"py-example-{os.getpid()}"
    provider = sys.argv[2] if len(sys.argv) > 2 else "cloudflare"
    if provider not in JOBS:
        print(f"enqueue_and_read: unknown provider {provider!r}; use one of {', '.join(JOBS)}", file=sys.stderr)
        return 2
    submit, results = f"{{{namespace}}}:submit", f"{{{namespace}}}:results"
    r = redis.Redis.from_url(url, decode_responses=True, protocol=2)

    # 1. The group, created once at the start of the stream (BUSYGROUP: it already exists).
    try:
        r.xgroup_create(results, GROUP, id="0", mkstream=True)
    except redis.ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise

    # 2. Enqueue: one XADD, one field `job`. With an `id`, enqueueing again after a timeout is harmless.
    job = {"id": job_id, **JOBS[provider], "metadata": {"example": "python", "provider": provider}}
    r.xadd(submit, {"job": json.dumps(job)})
    print(f"enqueued {job_id}", file=sys.stderr)

    # 3. Read results until ours arrives.
    handled = set()  # job ids already handled: a redelivered entry is not handled twice
    backlog = True  # our own pending entries first
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        redelivered = True
        if backlog:
            entries = read(r, results, "0", block=None)
            backlog = bool(entries)
        else:
            _, entries, _ = r.xautoclaim(results, GROUP, CONSUMER, CLAIM_MIN_IDLE_MS, start_id="0-0", count=100)
            if not entries:
                entries, redelivered = read(r, results, ">", block=2000), False
        for entry_id, fields in entries:
            if fields is None:  # trimmed from the stream while pending: nothing left to handle
                r.xack(results, GROUP, entry_id)
                continue
            mine, outcome = fields.get("job_id") == job_id, None
            if fields.get("job_id") not in handled:
                handled.add(fields.get("job_id"))
                if mine:
                    outcome = summary(fields, redelivered)
            r.xack(results, GROUP, entry_id)  # after handling: a crash before this line means a redelivery
            if outcome:
                print(json.dumps(outcome))
                if outcome["status"] != "completed":
                    print(f"enqueue_and_read: job {job_id} ended {outcome['status']}", file=sys.stderr)
                    return 1
                return 0
    print(f"enqueue_and_read: no result for {job_id} within 60 s; is the daemon running on namespace {namespace}?",
          file=sys.stderr)
    return 1


def read(r: redis.Redis, stream: str, start: str, block):
    """XREADGROUP of one stream: a list of (entry id, fields or None)."""
    reply = r.xreadgroup(GROUP, CONSUMER, {stream: start}, count=100, block=block)
    return reply[0][1] if reply else []


def summary(fields: dict, redelivered: bool) -> dict:
    """The result entry in brief: the `result` field is JSON text with one response per request, in order."""
    result = json.loads(fields["result"]) if "result" in fields else {"responses": []}
    return {
        "job_id": fields["job_id"],
        "status": fields["status"],
        "responses": len(result["responses"]),
        "succeeded": sum(1 for response in result["responses"] if response["success"]),
        "in_order": [response["index"] for response in result["responses"]] == list(range(len(result["responses"]))),
        "metadata": json.loads(fields["metadata"]) if "metadata" in fields else None,
        "redelivered": redelivered,
    }


if __name__ == "__main__":
    try:
        sys.exit(main())
    except redis.RedisError as error:
        print(f"enqueue_and_read: redis: {error}", file=sys.stderr)
        sys.exit(1)
