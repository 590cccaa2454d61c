-- Every error snowid raises for bad input or a misused setting, with its SQLSTATE.
CREATE EXTENSION snowid;
\set VERBOSITY verbose
SELECT snowid_timestamp(-1);
SELECT * FROM snowid_decode(-42);
SELECT snowid_worker_id(-1);
SELECT snowid_sequence(-1);
SELECT snowid_from_timestamp('2025-12-31 23:59:59.999+00');
SELECT snowid_from_timestamp('2095-09-07 15:47:35.552+00');
SELECT snowid_from_timestamp('infinity');
SELECT snowid_from_timestamp('-infinity');
SELECT snowid_next_batch(0);
SELECT snowid_next_batch(4096001);
SELECT snowid_handover(1024);
-- A database no server claimed from may be said to be a new registry, once.
SELECT snowid_registry_is_new();
SELECT snowid_registry_is_new();
SET snowid.worker_id = 5;
SET snowid.max_clock_backward = 100;
SET snowid.workerid = 5;
SELECT snowid_to_base32(-1);
SELECT snowid_from_base32('03B0MKY00240');
SELECT snowid_from_base32('03B0UKY002403');
SELECT snowid_from_base32('8000000000000');
SELECT snowid_wait_ready('-1 second');
-- What snowid_convert_column refuses.
CREATE TABLE int_keys (id serial PRIMARY KEY);
SELECT snowid_convert_column('int_keys');
SELECT snowid_convert_column('int_keys', 'no_such_column');
CREATE TABLE ahead (id bigint PRIMARY KEY);
INSERT INTO ahead VALUES (snowid_from_timestamp('2095-01-01 00:00+00'));
SELECT snowid_convert_column('ahead');
CREATE VIEW key_view AS SELECT 1::bigint AS id;
SELECT snowid_convert_column('key_view');
CREATE TABLE computed (id bigint GENERATED ALWAYS AS (1) STORED);
SELECT snowid_convert_column('computed');
CREATE ROLE not_the_owner;
GRANT ALL ON int_keys TO not_the_owner;
SET ROLE not_the_owner;
SELECT snowid_convert_column('int_keys');
RESET ROLE;
DROP TABLE int_keys;
DROP ROLE not_the_owner;
CREATE TABLE by_day (id bigserial, at date) PARTITION BY RANGE (at);
CREATE TABLE by_day_1 PARTITION OF by_day FOR VALUES FROM ('2026-01-01') TO ('2026-01-02');
SELECT snowid_convert_column('by_day_1');
SELECT snowid_convert_column(4294967295::oid::regclass);
CREATE TABLE later (id bigserial PRIMARY KEY);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT snowid_convert_column('later');
ROLLBACK;
-- Row-level security hides no row from the check of the largest value.
CREATE ROLE rls_owner;
GRANT CREATE ON SCHEMA public TO rls_owner;
SET ROLE rls_owner;
CREATE TABLE guarded (id bigint PRIMARY KEY);
INSERT INTO guarded VALUES (snowid_from_timestamp('2095-01-01 00:00+00'));
ALTER TABLE guarded ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY nothing ON guarded USING (false);
SELECT count(*) FROM guarded;
SELECT snowid_convert_column('guarded');
RESET ROLE;
-- A conversion is never skipped in silence.
SELECT snowid_convert_column(NULL);
SELECT snowid_convert_column('computed', NULL);
-- NULL in, NULL out.
\set VERBOSITY default
SELECT snowid_timestamp(NULL), snowid_worker_id(NULL), snowid_sequence(NULL), snowid_from_timestamp(NULL);
SELECT * FROM snowid_decode(NULL);
SELECT count(*) FROM snowid_next_batch(NULL);
SELECT snowid_to_base32(NULL), snowid_from_base32(NULL), snowid_wait_ready(NULL);
