-- The README's examples. A fresh server with snowid.worker_id = 17, snowid.database = 'usage'
-- (this database) and TimeZone = 'UTC'.
CREATE EXTENSION snowid;
-- The lease worker acquires the worker id within a second or so; ids are issued from then on.
DO $$ BEGIN
    FOR attempt IN 1..300 LOOP
        EXIT WHEN (SELECT lease_state FROM snowid_status()) = 'held';
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
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
