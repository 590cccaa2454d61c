-- snowid 0.4.0 -> 0.5.0: snowid_status() counts the calls that waited for the lease worker to move
-- the ceiling on (ceiling_waits). A function's result type cannot change in place.

DROP FUNCTION snowid_status();
CREATE FUNCTION snowid_status() RETURNS TABLE (
	worker_id integer,
	last_id bigint,
	ids_issued bigint,
	clock_backward_waits bigint,
	clock_backward_refusals bigint,
	sequence_overflow_waits bigint,
	lease_state text,
	lease_holder text,
	lease_expires_at timestamp with time zone,
	registry text,
	high_water_mark timestamp with time zone,
	last_error text,
	ceiling_waits bigint
)
STRICT VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowid_status_wrapper';
