"""SQLAlchemy 2 and snowid: the server makes the id, the ORM reads it back with RETURNING.

Connects through psycopg 3 with libpq's environment variables: PGHOST, PGPORT, PGUSER, PGDATABASE.
"""

import sys

from sqlalchemy import BigInteger, create_engine, event, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


def same(what, got, expected):
    if got != expected:
        sys.exit(f"sqlalchemy: MISMATCH in {what}: got {got!r}, expected {expected!r}")


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    # TEMPORARY: the table lives as long as the one connection below, and leaves nothing behind.
    __table_args__ = {"prefixes": ["TEMPORARY"]}

    # A server default, not a Python-side one: an id made in the application would need a worker
    # id and a clock per process, with nothing to stop two processes sharing one, while
    # snowid_next() issues under the server's leased worker id, above every id it issued before.
    # The DDL carries the DEFAULT, so rows inserted by plain SQL get it too, and the ORM fetches
    # the id with INSERT ... RETURNING.
    id: Mapped[int] = mapped_column(
        BigInteger, primary_key=True, server_default=text("snowid_next()")
    )
    item: Mapped[str]


# No host, user or database in the URL: libpq takes them from the PG* environment variables.
engine = create_engine("postgresql+psycopg://")
statements = []


@event.listens_for(engine, "before_cursor_execute")
def record(conn, cursor, statement, parameters, context, executemany):
    statements.append(statement)


with engine.connect() as conn:
    same("snowid_wait_ready()", conn.scalar(text("SELECT snowid_wait_ready()")), True)
    print("sqlalchemy: snowid_wait_ready() is true")

    Base.metadata.create_all(conn)
    with Session(conn) as session:
        order = Order(item="book")
        session.add(order)
        session.flush()
        insert = next(statement for statement in statements if statement.startswith("INSERT"))
        same("the INSERT's RETURNING clause", "RETURNING orders.id" in insert, True)
        same("order.id's type", type(order.id), int)
        server_digits = session.scalar(text("SELECT id::text FROM orders"))
        same("the ORM's id against the server's id::text", str(order.id), server_digits)
        print("sqlalchemy: the ORM read the server-made id back with INSERT ... RETURNING")
        print("sqlalchemy: order.id is a Python int equal to the server's id")

        session.expunge_all()  # so that the query below reads the row from the server
        found = session.scalars(select(Order).where(Order.id == order.id)).one()
        same("the row selected by the id", (found.id, found.item), (order.id, "book"))
        print("sqlalchemy: selecting Order by that id found the row")
