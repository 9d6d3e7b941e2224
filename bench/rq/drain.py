"""RQ's figure for wasq's side-by-side benchmark: N no-op jobs (tasks.echo, ~100-byte payload,
results dropped with result_ttl=0) are enqueued first (enqueue_many, batches of 1000), then
one in-process SimpleWorker drains them in burst mode; prints one JSON line with the enqueue
and drain times and jobs/s. Usage: python drain.py REDIS_PORT N
"""

import json
import logging
import os
import sys
import time

# The worker imports tasks.echo by name: find it beside this file, and leave no __pycache__.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# RQ's own log handler sends records below ERROR to stdout; a root handler on stderr
# keeps stdout for the one JSON line (RQ then adds none of its own).
logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")

from redis import Redis  # noqa: E402
from rq import Queue, SimpleWorker  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.results import Result  # noqa: E402

from tasks import echo  # noqa: E402

BATCH = 1000


def pad_for(i):
    """A pad that makes json.dumps({"i": i, "pad": pad}) 100 bytes."""
    return "x" * (100 - len(json.dumps({"i": i, "pad": ""})))


def cleanup(connection, queue, worker, job_ids):
    """Best effort: the queue, its registries, the worker's hash and what is left of the jobs."""
    try:
        queue.delete(delete_jobs=True)
        pipe = connection.pipeline(transaction=False)
        if worker is not None:
            pipe.delete(worker.key)
        for job_id in job_ids:
            key = Job.key_for(job_id)
            pipe.delete(key, f"{key}:dependents", f"{key}:dependencies", Result.get_key(job_id))
        pipe.execute()
        keys = list(connection.scan_iter(match=f"rq:*{queue.name}*", count=1000))
        if keys:
            connection.delete(*keys)
    except Exception as e:
        print(f"cleanup of {queue.name} failed: {e}", file=sys.stderr)


def main():
    if len(sys.argv) != 3:
        print("usage: python drain.py REDIS_PORT N", file=sys.stderr)
        return 2
    port, n = int(sys.argv[1]), int(sys.argv[2])
    connection = Redis(host="127.0.0.1", port=port)
    queue = Queue(f"bench-{os.getpid()}", connection=connection)

    worker = None
    job_ids = []
    try:
        t0 = time.perf_counter()
        for start in range(0, n, BATCH):
            batch = [
                Queue.prepare_data(echo, args=({"i": i, "pad": pad_for(i)},), result_ttl=0)
                for i in range(start, min(n, start + BATCH))
            ]
            job_ids.extend(job.id for job in queue.enqueue_many(batch))
        enqueue_ms = (time.perf_counter() - t0) * 1000

        worker = SimpleWorker([queue], connection=connection)
        t0 = time.perf_counter()
        worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
        drain_ms = (time.perf_counter() - t0) * 1000

        # The worker's hash outlives its burst by a minute and holds its success count.
        succeeded = int(connection.hget(worker.key, "successful_job_count") or 0)
        # result_ttl=0 deletes each job's hash once it succeeded: none may be left.
        pipe = connection.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(Job.key_for(job_id))
        left = sum(pipe.execute())
        problems = {
            "not succeeded": n - succeeded,
            "queued": queue.count,
            "failed": queue.failed_job_registry.count,
            "started": queue.started_job_registry.count,
            "job hashes left": left,
        }
        if len(job_ids) != n or any(problems.values()):
            print(f"rq did not finish all {n} jobs ({len(job_ids)} enqueued): {problems}", file=sys.stderr)
            return 1
    finally:
        cleanup(connection, queue, worker, job_ids)

    result = {"system": "rq", "n": n, "enqueue_ms": enqueue_ms, "drain_ms": drain_ms, "per_sec": n * 1000 / drain_ms}
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
