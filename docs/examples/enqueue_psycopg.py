#!/usr/bin/env python3
"""Enqueue leash tasks from a Python application with psycopg2 (docs/enqueue-from-apps.md).

The task is written in the application's own transaction: it exists exactly when the order
does. Run: python3 enqueue_psycopg.py postgresql://user@host/db  (after `leash migrate`).
tests/integration/sqlapi.sh runs this file and checks the rows it leaves.
"""
import json
import sys

import psycopg2

QUEUE = "agent_work_queue"  # the table `leash migrate` made (--table)


def place_order(conn, order_id, fail=False):
    """One order and its task, committed together, or neither."""
    with conn:  # a transaction: commit on success, rollback on an exception
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id) VALUES (%s)", (order_id,))
            # Named arguments: every option `leash enqueue` has (tenant, shard, run_after,
            # delay_s, max_attempts, batch, priority, dedup_key, max_crashes).
            cur.execute(
                f"SELECT {QUEUE}_enqueue(%s::jsonb, batch => %s, dedup_key => %s)",
                (json.dumps({"order_id": order_id}), "orders", f"order-{order_id}"),
            )
            task_id = cur.fetchone()[0]
            if fail:
                raise RuntimeError("payment refused")  # rolls back the order and its task
            return task_id


def main():
    conn = psycopg2.connect(sys.argv[1] if len(sys.argv) > 1 else "")
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY)")

    first = place_order(conn, 1)
    try:
        place_order(conn, 2, fail=True)
    except RuntimeError:
        pass

    # A retried request (same dedup key while the task is pending or leased) gets the same
    # task back instead of a second one.
    with conn, conn.cursor() as cur:
        cur.execute(f"SELECT {QUEUE}_enqueue(%s::jsonb, dedup_key => %s)",
                    (json.dumps({"order_id": 1}), "order-1"))
        again = cur.fetchone()[0]

    # Many at once: a JSON array of objects with the fields of a `leash enqueue --file` line.
    tasks = [{"payload": {"n": n}, "batch": "bulk", "priority": n} for n in range(3)]
    with conn, conn.cursor() as cur:
        cur.execute(f"SELECT ordinal, id, inserted FROM {QUEUE}_enqueue_many(%s::jsonb)",
                    (json.dumps(tasks),))
        bulk = cur.fetchall()

    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM orders WHERE id = 2")
        rolled_back = cur.fetchone()[0]
    conn.close()
    print(f"result: committed=1 rolled_back={rolled_back} "
          f"dedup_same_id={'true' if again == first else 'false'} "
          f"bulk={sum(1 for _, _, inserted in bulk if inserted)}")


if __name__ == "__main__":
    main()
