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
SET snowid.worker_id = 5;
SET snowid.max_clock_backward = 100;
SET snowid.workerid = 5;
-- NULL in, NULL out.
\set VERBOSITY default
SELECT snowid_timestamp(NULL), snowid_worker_id(NULL), snowid_sequence(NULL), snowid_from_timestamp(NULL);
SELECT * FROM snowid_decode(NULL);
SELECT count(*) FROM snowid_next_batch(NULL);
