-- snowid 0.6.0 -> 0.7.0: a worker id belongs to one server. The takeover from a fenced primary is
-- gone: snowid_take_over_fenced(), snowid.lease_take_over and the two columns only it read (the
-- holder's timeline and clock). Every lease row and high-water mark stays. snowid_status() tells a
-- standby whose worker id another server holds (worker_id_held_by).

DROP FUNCTION snowid_take_over_fenced();
DROP FUNCTION snowid.lease_take_over(integer, text, text, text, bigint, bigint, boolean, bigint, bigint, bigint);

ALTER TABLE snowid.worker_lease DROP COLUMN holder_timeline, DROP COLUMN holder_clock_ms;

-- The claim no longer records the columns dropped above, and on a shared registry refuses a row
-- that another run of the same holder (a copy of the server) holds while its lease runs.
CREATE OR REPLACE FUNCTION snowid.lease_claim(
    p_worker_id integer, p_holder text, p_incarnation text, p_holder_name text,
    p_ttl_ms bigint, p_reserve_until_ms bigint, p_takeover_on_expiry boolean, p_timeline bigint,
    OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint)
LANGUAGE plpgsql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease snowid.worker_lease;
    claimed_at timestamptz := clock_timestamp();
    locked boolean := false;
    trusted boolean := (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user);
BEGIN
    IF p_ttl_ms NOT BETWEEN 1000 AND 3600000 THEN
        RAISE EXCEPTION 'a lease''s time-to-live must be between 1000 and 3600000 ms, not %', p_ttl_ms
            USING ERRCODE = '22023';
    END IF;
    p_reserve_until_ms := least(p_reserve_until_ms,
        (extract(epoch FROM claimed_at) * 1000)::bigint - 1767225600000 + p_ttl_ms + 3600000);
    INSERT INTO snowid.worker_lease (worker_id) VALUES (p_worker_id) ON CONFLICT DO NOTHING;
    -- Decided on the row as it stands, then again once locked: a claim that is refused never
    -- locks the row, so that no role can hold up another's renewals by leaving its transaction open.
    LOOP
        IF locked THEN
            SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id FOR UPDATE;
        ELSE
            SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id;
        END IF;
        IF lease.holder = p_holder AND lease.expires_at > claimed_at AND NOT trusted
           AND lease.holder_role IS DISTINCT FROM session_user THEN
            RAISE EXCEPTION 'permission denied for the lease on worker id %: it is held by %',
                p_worker_id, coalesce('role "' || lease.holder_role || '"', 'a role snowid 0.2.0 did not record')
                USING ERRCODE = '42501';
        END IF;
        released := lease.holder IS NULL AND lease.released_by IS NOT NULL;
        IF (lease.holder IS NOT NULL AND lease.holder <> p_holder
            AND (NOT p_takeover_on_expiry OR lease.expires_at > claimed_at))
           -- On a shared registry, another run of this holder whose lease runs: an earlier run
           -- not yet run out, or a copy of this server (a cloned machine) that renews it.
           OR (p_takeover_on_expiry AND lease.holder = p_holder
               AND lease.incarnation IS DISTINCT FROM p_incarnation AND lease.expires_at > claimed_at)
           OR (released AND NOT p_takeover_on_expiry AND lease.released_by <> p_holder
               AND split_part(lease.released_by, '-', 1) = split_part(p_holder, '-', 1)
               AND lease.released_timeline >= p_timeline) THEN
            granted := false;
            holder_name := lease.holder_name;
            expires_at_unix_ms := (extract(epoch FROM lease.expires_at) * 1000)::bigint;
            RETURN;
        END IF;
        EXIT WHEN locked;
        locked := true;
    END LOOP;
    granted := true;
    floor_ms := lease.high_water_ms;
    -- Another role naming the holder (the row is readable) takes the row over, and cannot release
    -- it below the mark as it stands.
    continued := coalesce(lease.holder = p_holder
                          AND (trusted OR lease.holder_role = session_user), false);
    renewal := continued AND lease.incarnation IS NOT DISTINCT FROM p_incarnation;
    UPDATE snowid.worker_lease l
       SET holder = p_holder, incarnation = p_incarnation, holder_name = p_holder_name,
           acquired_at = CASE WHEN renewal THEN l.acquired_at ELSE claimed_at END,
           renewed_at = claimed_at,
           expires_at = claimed_at + p_ttl_ms * interval '1 millisecond',
           high_water_ms = greatest(l.high_water_ms, p_reserve_until_ms),
           released_by = NULL, released_timeline = NULL, holder_role = session_user,
           acquired_mark_ms = CASE WHEN continued THEN coalesce(l.acquired_mark_ms, l.high_water_ms)
                                   ELSE l.high_water_ms END
     WHERE l.worker_id = p_worker_id
    RETURNING l.high_water_ms, l.holder_name, (extract(epoch FROM l.expires_at) * 1000)::bigint,
              (extract(epoch FROM l.acquired_at) * 1000000)::bigint
         INTO reserved_until_ms, holder_name, expires_at_unix_ms, tenure;
END
$$;

DROP FUNCTION snowid_status();
CREATE  FUNCTION "snowid_status"() RETURNS TABLE (
	"worker_id" INT,  /* Option < i32 > */
	"last_id" bigint,  /* Option < i64 > */
	"ids_issued" bigint,  /* i64 */
	"clock_backward_waits" bigint,  /* i64 */
	"clock_backward_refusals" bigint,  /* i64 */
	"sequence_overflow_waits" bigint,  /* i64 */
	"lease_state" TEXT,  /* String */
	"lease_holder" TEXT,  /* Option < String > */
	"lease_expires_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"registry" TEXT,  /* String */
	"high_water_mark" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"last_error" TEXT,  /* Option < String > */
	"ceiling_waits" bigint,  /* i64 */
	"refused_calls" bigint,  /* i64 */
	"lease_held" bool,  /* bool */
	"lease_seconds_left" double precision,  /* f64 */
	"in_recovery" bool,  /* bool */
	"worker_id_held_by" TEXT  /* Option < String > */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowid_status_wrapper';

-- A row that another run of this server holds is no one's to take while it runs.
CREATE OR REPLACE FUNCTION snowid.lease_claim_any(
    p_holder text, p_incarnation text, p_holder_name text, p_ttl_ms bigint, p_reserve_until_ms bigint,
    p_timeline bigint,
    OUT worker_id integer, OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint)
LANGUAGE plpgsql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT l.worker_id INTO worker_id FROM snowid.worker_lease l
     WHERE l.holder = p_holder
       AND (l.incarnation IS NOT DISTINCT FROM p_incarnation OR l.expires_at <= clock_timestamp())
     ORDER BY l.worker_id LIMIT 1;
    IF worker_id IS NULL THEN
        LOCK TABLE snowid.worker_lease IN SHARE UPDATE EXCLUSIVE MODE;
        SELECT l.worker_id INTO worker_id FROM snowid.worker_lease l
         WHERE l.holder IS NULL OR l.expires_at <= clock_timestamp() ORDER BY l.worker_id LIMIT 1;
    END IF;
    IF worker_id IS NULL THEN
        SELECT min(free.id) INTO worker_id FROM generate_series(0, 1023) AS free(id)
         WHERE NOT EXISTS (SELECT FROM snowid.worker_lease l WHERE l.worker_id = free.id);
    END IF;
    IF worker_id IS NULL THEN
        granted := false;
        holder_name := 'other servers (all 1024 worker ids are leased)';
        RETURN;
    END IF;
    SELECT c.granted, c.floor_ms, c.reserved_until_ms, c.holder_name, c.expires_at_unix_ms,
           c.continued, c.renewal, c.released, c.tenure
      INTO granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms,
           continued, renewal, released, tenure
      FROM snowid.lease_claim(worker_id, p_holder, p_incarnation, p_holder_name, p_ttl_ms,
                              p_reserve_until_ms, true, p_timeline) c;
END
$$;
