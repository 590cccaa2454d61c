-- The documentation's examples. A fresh server with snowid.worker_id = 17, snowid.database = 'usage'
-- (this database) and TimeZone = 'UTC'.
CREATE EXTENSION snowid;
-- True once this server holds the lease on its worker id, within a second or so of the start.
SELECT snowid_wait_ready();
SELECT worker_id, lease_state, registry FROM snowid_status();
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text);
INSERT INTO orders (item) VALUES ('book'), ('pen'), ('lamp');
SELECT item, snowid_worker_id(id) AS worker_id FROM orders ORDER BY id;
SELECT count(*), count(DISTINCT id), min(snowid_worker_id(id)) AS worker_id FROM snowid_next_batch(10000) id;
SELECT * FROM snowid_decode(120493965312069635);
SELECT snowid_timestamp(120493965312069635),
       snowid_worker_id(120493965312069635),
       snowid_sequence(120493965312069635);
SELECT snowid_from_timestamp('2026-11-29 12:00:00.0005+00');
SELECT snowid_from_timestamp('2026-01-01 00:00:00+00') AS first_possible_id;
-- Ids made in one day, found through the primary key index.
CREATE TABLE events (id bigint PRIMARY KEY, what text);
INSERT INTO events VALUES
    (snowid_from_timestamp('2026-11-28 23:59:59.999+00') + 4194303, 'last id of the 28th'),
    (120493965312069635, 'noon on the 29th'),
    (snowid_from_timestamp('2026-11-30 00:00:00+00'), 'first id of the 30th');
SELECT what FROM events
 WHERE id >= snowid_from_timestamp('2026-11-29') AND id < snowid_from_timestamp('2026-11-30');
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT what FROM events
 WHERE id >= snowid_from_timestamp('2026-11-29') AND id < snowid_from_timestamp('2026-11-30');
RESET enable_seqscan;
SELECT worker_id, ids_issued, clock_backward_waits, clock_backward_refusals FROM snowid_status();
SHOW snowid.worker_id;
SHOW snowid.max_clock_backward;
-- Two forms of an id that JSON carries exactly: its decimal text, and its base32 text.
SELECT json_build_object('id', id::text, 'key', snowid_to_base32(id)) AS row
  FROM (VALUES (120493965312069635)) AS t(id);
SELECT snowid_from_base32('03B0MKY002403'), snowid_from_base32('03b0mky002403');
-- Texts sort as their ids in the "C" collation; in some others, letter pairs such as AA do not.
CREATE COLLATION danish (provider = icu, locale = 'da-DK');
SELECT t, snowid_from_base32(t) AS id FROM (VALUES ('03B0MKAZ02403'), ('03B0MKAA02403')) AS v(t)
 ORDER BY t COLLATE "C";
SELECT t, snowid_from_base32(t) AS id FROM (VALUES ('03B0MKAZ02403'), ('03B0MKAA02403')) AS v(t)
 ORDER BY t COLLATE danish;
-- Converting a bigserial key and an identity key.
CREATE TABLE invoices (id bigserial PRIMARY KEY, customer text);
INSERT INTO invoices (customer) VALUES ('ada'), ('grace');
SELECT snowid_convert_column('invoices');
INSERT INTO invoices (customer) VALUES ('edsger');
SELECT customer, id <= 2 AS from_the_sequence FROM invoices ORDER BY id;
SELECT snowid_convert_column('invoices');
DROP SEQUENCE invoices_id_seq;
CREATE TABLE tickets (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, title text);
INSERT INTO tickets (title) VALUES ('first');
SELECT snowid_convert_column('tickets', 'id');
SELECT column_default, is_identity, is_nullable FROM information_schema.columns
 WHERE table_name = 'tickets' AND column_name = 'id';
-- GENERATED ALWAYS went with the identity: an explicit id is accepted now.
INSERT INTO tickets (id, title) VALUES (42, 'explicit');
-- A partitioned table, converted with all its partitions by a role that owns it, no superuser.
CREATE ROLE app_owner;
GRANT CREATE ON SCHEMA public TO app_owner;
SET ROLE app_owner;
CREATE TABLE readings (id bigserial, taken date NOT NULL) PARTITION BY RANGE (taken);
CREATE TABLE readings_2026 PARTITION OF readings FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
SELECT snowid_convert_column('readings');
RESET ROLE;
SELECT table_name, column_default FROM information_schema.columns
 WHERE table_name LIKE 'readings%' AND column_name = 'id' ORDER BY table_name;
-- Other defaults are replaced; a column without one gets one; a rollback undoes the conversion.
CREATE TABLE notes (id bigint DEFAULT 0, note_id bigint);
SELECT snowid_convert_column('notes');
SELECT snowid_convert_column('notes', 'note_id');
CREATE TABLE drafts (id bigserial);
BEGIN;
SELECT snowid_convert_column('drafts');
ROLLBACK;
SELECT column_default FROM information_schema.columns WHERE table_name = 'drafts';
-- Rows merged from several writers by logical replication: the worker id in each key names the
-- writer that issued it.
CREATE TABLE merged_orders (id bigint PRIMARY KEY);
INSERT INTO merged_orders
SELECT snowid_from_timestamp(timestamptz '2026-12-01 09:00' + n * interval '1 minute') | (writer << 12)
  FROM generate_series(1, 3) writer, generate_series(1, 10 * writer) n;
SELECT snowid_worker_id(id) AS worker_id, count(*) AS rows, max(snowid_timestamp(id)) AS newest
  FROM merged_orders GROUP BY 1 ORDER BY 1;
