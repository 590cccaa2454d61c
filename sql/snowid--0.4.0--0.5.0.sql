-- snowid 0.4.0 -> 0.5.0: snowid_status() counts the calls that waited for the lease worker to move
-- the ceiling on (ceiling_waits) and every refused call (refused_calls; snowid_refusals() counts
-- them by reason), and says whether the lease is held, for how much longer, and whether the server
-- is in recovery; a promoted standby takes its worker id over at once from the fenced primary it
-- was promoted after (snowid_take_over_fenced(), snowid.lease_take_over()), for which every claim
-- now records the claimant's timeline and clock.

-- A function's result type cannot change in place.
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
	ceiling_waits bigint,
	refused_calls bigint,
	lease_held boolean,
	lease_seconds_left double precision,
	in_recovery boolean
)
STRICT VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowid_status_wrapper';

CREATE FUNCTION snowid_refusals() RETURNS TABLE (
	reason text,
	calls bigint
)
STRICT VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowid_refusals_wrapper';

ALTER TABLE snowid.worker_lease ADD COLUMN holder_timeline bigint, ADD COLUMN holder_clock_ms bigint;
COMMENT ON COLUMN snowid.worker_lease.holder_timeline IS 'The WAL timeline the holder claimed the lease on';
COMMENT ON COLUMN snowid.worker_lease.holder_clock_ms IS 'The holder''s own clock at its last claim, in milliseconds since 2026-01-01';

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
    claimant_clock_ms bigint := p_reserve_until_ms - p_ttl_ms;
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
                                   ELSE l.high_water_ms END,
           holder_timeline = p_timeline, holder_clock_ms = claimant_clock_ms
     WHERE l.worker_id = p_worker_id
    RETURNING l.high_water_ms, l.holder_name, (extract(epoch FROM l.expires_at) * 1000)::bigint,
              (extract(epoch FROM l.acquired_at) * 1000000)::bigint
         INTO reserved_until_ms, holder_name, expires_at_unix_ms, tenure;
END
$$;

-- Takes a worker id over at once, for a standby that a failover manager promoted after fencing
-- the primary that holds it: a holder of the same cluster (the same system identifier and the same
-- cluster_name, which Patroni sets to its scope) that claimed the lease on an earlier timeline, with
-- the caller's login role. The caller vouches that the holder issues nothing after p_fence_ms
-- (milliseconds since 2026-01-01 by the caller's clock);
-- the holder's clock may be up to p_max_skew_ms ahead of the caller's, so the new holder starts at
-- p_fence_ms + p_max_skew_ms instead of the holder's reservation, and never below the mark the
-- holder took the row at; its release lowers the mark no further than that start. Refused (55000)
-- when the holder's clock was seen further ahead than that: at its last claim, or in the
-- reservations it made since it took the row (which assumes that the nodes share one lease_ttl). A
-- free, released, expired (with p_takeover_on_expiry) or own row is claimed as lease_claim claims
-- it. taken_from names the holder taken over from; NULL for an ordinary claim.
CREATE FUNCTION snowid.lease_take_over(
    p_worker_id integer, p_holder text, p_incarnation text, p_holder_name text,
    p_ttl_ms bigint, p_reserve_until_ms bigint, p_takeover_on_expiry boolean, p_timeline bigint,
    p_fence_ms bigint, p_max_skew_ms bigint,
    OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint, OUT taken_from text)
LANGUAGE plpgsql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease snowid.worker_lease;
    trusted boolean := (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user);
    registry_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000;
    ahead_ms bigint;
    earlier_mark_ms bigint;
BEGIN
    -- Decided unlocked, then again once locked, as lease_claim does.
    FOR attempt IN 1..2 LOOP
        IF attempt = 1 THEN
            SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id;
        ELSE
            SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id FOR UPDATE;
        END IF;
        EXIT WHEN lease.holder IS NULL OR lease.holder = p_holder
            OR (p_takeover_on_expiry AND lease.expires_at <= clock_timestamp());
        IF split_part(lease.holder, '-', 1) <> split_part(p_holder, '-', 1)
           OR position('@' IN p_holder_name) = 0
           OR split_part(lease.holder_name, '@', 1) IS DISTINCT FROM split_part(p_holder_name, '@', 1) THEN
            RAISE EXCEPTION 'worker id % is held by %, a server of another cluster: a takeover takes a worker id only from an earlier primary of this server''s own cluster (the same system identifier and cluster_name)',
                p_worker_id, lease.holder_name USING ERRCODE = '55000';
        END IF;
        IF lease.holder_timeline IS NULL OR lease.holder_clock_ms IS NULL THEN
            RAISE EXCEPTION 'worker id % is held by %, which claimed it with a snowid older than 0.5.0 and recorded neither its timeline nor its clock',
                p_worker_id, lease.holder_name USING ERRCODE = '55000';
        END IF;
        IF lease.holder_timeline >= p_timeline THEN
            RAISE EXCEPTION 'worker id % is held by %, on timeline %, not before this server''s timeline %: it is not a primary this server was promoted after',
                p_worker_id, lease.holder_name, lease.holder_timeline, p_timeline USING ERRCODE = '55000';
        END IF;
        IF NOT trusted AND lease.holder_role IS DISTINCT FROM session_user THEN
            RAISE EXCEPTION 'permission denied for the lease on worker id %: it is held by %',
                p_worker_id, coalesce('role "' || lease.holder_role || '"', 'a role snowid 0.2.0 did not record')
                USING ERRCODE = '42501';
        END IF;
        -- How far the holder's clock was ahead of the caller's: directly, at its last claim; on a
        -- shared registry, each clock against this registry's own at its claim; and in the highest
        -- reservation it made since it took the row (its clock then, plus a time-to-live).
        ahead_ms := greatest(lease.holder_clock_ms - p_fence_ms,
            (lease.holder_clock_ms - ((extract(epoch FROM lease.renewed_at) * 1000)::bigint - 1767225600000))
            - (p_fence_ms - registry_ms),
            CASE WHEN lease.high_water_ms > coalesce(lease.acquired_mark_ms, 0)
                 THEN lease.high_water_ms - p_ttl_ms - p_fence_ms END);
        IF ahead_ms > p_max_skew_ms THEN
            RAISE EXCEPTION 'the clock of %, which holds worker id %, read % ms ahead of this server''s, more than snowid.max_clock_skew (% ms) allows: it may have issued ids above where this server would start',
                lease.holder_name, p_worker_id, ahead_ms, p_max_skew_ms USING ERRCODE = '55000';
        END IF;
        IF attempt = 2 THEN
            earlier_mark_ms := coalesce(lease.acquired_mark_ms, lease.high_water_ms);
            taken_from := lease.holder_name;
            -- Freed inside this transaction, for lease_claim to grant as a free row.
            UPDATE snowid.worker_lease l
               SET holder = NULL, incarnation = NULL, expires_at = NULL,
                   released_by = NULL, released_timeline = NULL
             WHERE l.worker_id = p_worker_id;
        END IF;
    END LOOP;
    SELECT c.granted, c.floor_ms, c.reserved_until_ms, c.holder_name, c.expires_at_unix_ms,
           c.continued, c.renewal, c.released, c.tenure
      INTO granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms,
           continued, renewal, released, tenure
      FROM snowid.lease_claim(p_worker_id, p_holder, p_incarnation, p_holder_name, p_ttl_ms,
                              p_reserve_until_ms, p_takeover_on_expiry, p_timeline) c;
    IF taken_from IS NOT NULL THEN
        floor_ms := greatest(earlier_mark_ms, p_fence_ms + p_max_skew_ms);
        -- The fenced holder's ids are below the floor: the new holder's release may lower the mark
        -- to there, never below.
        UPDATE snowid.worker_lease l SET acquired_mark_ms = floor_ms WHERE l.worker_id = p_worker_id;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION snowid.lease_take_over(integer, text, text, text, bigint, bigint, boolean, bigint, bigint, bigint) FROM PUBLIC;

CREATE FUNCTION snowid_take_over_fenced() RETURNS text
STRICT VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowid_take_over_fenced_wrapper';
REVOKE ALL ON FUNCTION snowid_take_over_fenced() FROM PUBLIC;
