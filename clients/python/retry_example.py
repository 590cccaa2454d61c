"""psycopg 3 and snowid's refusals: retry the ones that end by themselves, report the others.

A refusal that ends by itself (the lease being claimed, the clock waited out, the registry
settling) is SQLSTATE 40001, which psycopg raises as SerializationFailure; one that needs an
operator (no worker id set, the worker id held by another server) is 55000, and retrying it waits
for nothing. docs/functions.md#refusals-retry-or-call-someone lists every refusal.

Inserts one row, retrying the whole transaction on 40001 with a growing pause for up to
SNOWID_RETRY_FOR seconds (30 by default), and exits non-zero at once on any other error.
Connects with libpq's environment variables: PGHOST, PGPORT, PGUSER, PGDATABASE.
"""

import os
import sys
import time

import psycopg
from psycopg import errors

RETRY_FOR_S = float(os.environ.get("SNOWID_RETRY_FOR", "30"))


def insert_order(conn, item):
    """Inserts an order; returns its id and how many refusals were retried first."""
    deadline = time.monotonic() + RETRY_FOR_S
    pause = 0.05
    retried = 0
    while True:
        try:
            with conn.transaction():
                (order_id,) = conn.execute(
                    "INSERT INTO orders (item) VALUES (%s) RETURNING id", (item,)
                ).fetchone()
            return order_id, retried
        except errors.SerializationFailure as refusal:
            if time.monotonic() + pause > deadline:
                sys.exit(
                    f"retry: still refused after {RETRY_FOR_S:g} s of retries: "
                    f"{refusal.diag.message_primary}"
                )
            if retried == 0:
                print(f"retry: retried SQLSTATE {refusal.sqlstate}: {refusal.diag.message_primary}")
            retried += 1
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


# Autocommit, so that each conn.transaction() is a transaction of its own, run again whole.
with psycopg.connect(autocommit=True) as conn:
    conn.execute(
        "CREATE TEMPORARY TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text)"
    )
    try:
        order_id, retried = insert_order(conn, "book")
    except psycopg.Error as error:
        sys.exit(f"retry: SQLSTATE {error.sqlstate} is not retried: {error.diag.message_primary}")
    (stored,) = conn.execute("SELECT id FROM orders").fetchone()
    if stored != order_id:
        sys.exit(f"retry: MISMATCH: the row holds {stored}, the insert returned {order_id}")
    print(f"retry: the insert got its id after {retried} refusals retried")
