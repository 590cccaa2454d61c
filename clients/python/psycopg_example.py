"""psycopg 3 and snowid: a Python int holds every bigint exactly.

Connects with libpq's environment variables: PGHOST, PGPORT, PGUSER, PGDATABASE.
"""

import sys
from datetime import datetime, timedelta, timezone

import psycopg

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Python's int(text, 32) reads these digits, in the same order.
BASE32HEX = "0123456789ABCDEFGHIJKLMNOPQRSTUV"


def same(what, got, expected):
    if got != expected:
        sys.exit(f"psycopg: MISMATCH in {what}: got {got!r}, expected {expected!r}")


# An empty connection string: libpq takes everything from the PG* environment variables.
with psycopg.connect() as conn:
    same("snowid_wait_ready()", conn.execute("SELECT snowid_wait_ready()").fetchone(), (True,))
    print("psycopg: snowid_wait_ready() is true")
    # The first millisecond whose ids are 2**53 or more, above Number.MAX_SAFE_INTEGER (2**53 - 1).
    (first_id,) = conn.execute(
        "SELECT snowid_from_timestamp('2026-01-25 20:31:23.648+00')"
    ).fetchone()
    same("the first id of 2026-01-25 20:31:23.648 UTC", first_id, 2**53)
    print("psycopg: ids reach 2**53 from 2026-01-25 20:31:23.648 UTC on")

    conn.execute(
        "CREATE TEMPORARY TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text)"
    )
    (order_id,) = conn.execute("INSERT INTO orders (item) VALUES ('book') RETURNING id").fetchone()
    same("the id's type", type(order_id), int)
    same("the id against 2**53", order_id > 2**53, True)
    # The server's digits as text, so that no conversion of the driver's is trusted.
    (server_digits,) = conn.execute("SELECT id::text FROM orders").fetchone()
    same("the id against the server's id::text", str(order_id), server_digits)
    row = conn.execute("SELECT item FROM orders WHERE id = %s", (order_id,)).fetchone()
    same("the row selected by the id", row, ("book",))
    print("psycopg: INSERT ... RETURNING id gave a Python int equal to the server's id")
    print("psycopg: selecting by that int found the row")

    (b32,) = conn.execute("SELECT snowid_to_base32(%s)", (order_id,)).fetchone()
    same("the base32 text's length", len(b32), 13)
    same(
        "the base32 text read in Python",
        int(b32.translate(str.maketrans(CROCKFORD, BASE32HEX)), 32),
        order_id,
    )
    (back,) = conn.execute("SELECT snowid_from_base32(%s)", (b32.lower(),)).fetchone()
    same("snowid_from_base32 of the lower-case text", back, order_id)
    print("psycopg: snowid_to_base32 gave 13 characters, and snowid_from_base32 gave the id back")
    try:
        with conn.transaction():  # a savepoint: the error must not end the whole transaction
            conn.execute("SELECT snowid_from_base32(%s)", (b32[:12] + "U",))
        sys.exit("psycopg: MISMATCH: snowid_from_base32 accepted a U, which is no Crockford digit")
    except psycopg.errors.InvalidTextRepresentation:
        print("psycopg: snowid_from_base32 of a text with a U raised SQLSTATE 22P02")

    decoded = conn.execute("SELECT * FROM snowid_decode(%s)", (order_id,)).fetchone()
    layout = (
        EPOCH + timedelta(milliseconds=order_id >> 22),
        (order_id >> 12) & 1023,
        order_id & 4095,
    )
    same("snowid_decode against the layout", decoded, layout)
    print("psycopg: snowid_decode agrees with the bit layout computed in Python")

    # psycopg reads json with Python's json module, whose integers are exact too.
    (document,) = conn.execute("SELECT json_build_object('id', id) FROM orders").fetchone()
    same("the id in json_build_object", document, {"id": order_id})
    print("psycopg: json_build_object('id', id) parsed to the exact int")
