-- snowid 0.1.0 -> 0.2.0: the worker-id lease registry, and the lease in snowid_status().

-- The lease registry: one row per worker id ever leased. Any role may read it; only the lease
-- functions, run by the snowid lease worker as a superuser, write it.
CREATE SCHEMA snowid;
COMMENT ON SCHEMA snowid IS 'snowid lease registry';

CREATE TABLE snowid.worker_lease (
    worker_id     integer PRIMARY KEY CHECK (worker_id BETWEEN 0 AND 1023),
    holder        text,
    incarnation   text,
    holder_name   text,
    acquired_at   timestamptz,
    renewed_at    timestamptz,
    expires_at    timestamptz,
    high_water_ms bigint NOT NULL DEFAULT 0 CHECK (high_water_ms >= 0)
);
COMMENT ON TABLE snowid.worker_lease IS 'Which server holds which snowid worker id';
COMMENT ON COLUMN snowid.worker_lease.holder IS 'The holding server (system identifier and a hash of its host, port and data directory); NULL when free';
COMMENT ON COLUMN snowid.worker_lease.incarnation IS 'The run of the holding server';
COMMENT ON COLUMN snowid.worker_lease.expires_at IS 'When the lease ends unless renewed, by this registry''s clock';
COMMENT ON COLUMN snowid.worker_lease.high_water_ms IS 'Milliseconds since 2026-01-01 that every id issued under this worker id is below; the next holder starts here';

REVOKE ALL ON snowid.worker_lease FROM PUBLIC;
GRANT USAGE ON SCHEMA snowid TO PUBLIC;
GRANT SELECT ON snowid.worker_lease TO PUBLIC;

-- Acquires or renews a lease. Granted when the row is free, expired, or held by the same server
-- (a restart of it takes its lease back at once). A new holder gets the row's high-water mark as
-- the floor of its ids; every claim raises the mark to the claimant's reservation.
CREATE FUNCTION snowid.lease_claim(
    p_worker_id integer, p_holder text, p_incarnation text, p_holder_name text,
    p_ttl_ms bigint, p_reserve_until_ms bigint,
    OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease snowid.worker_lease;
    claimed_at timestamptz := clock_timestamp();
BEGIN
    INSERT INTO snowid.worker_lease (worker_id) VALUES (p_worker_id) ON CONFLICT DO NOTHING;
    SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id FOR UPDATE;
    IF lease.holder IS NOT NULL AND lease.holder <> p_holder AND lease.expires_at > claimed_at THEN
        granted := false;
        holder_name := lease.holder_name;
        expires_at_unix_ms := (extract(epoch FROM lease.expires_at) * 1000)::bigint;
        RETURN;
    END IF;
    granted := true;
    IF lease.holder IS NOT DISTINCT FROM p_holder AND lease.incarnation IS NOT DISTINCT FROM p_incarnation THEN
        floor_ms := NULL;
    ELSE
        floor_ms := lease.high_water_ms;
    END IF;
    UPDATE snowid.worker_lease l
       SET holder = p_holder, incarnation = p_incarnation, holder_name = p_holder_name,
           acquired_at = CASE WHEN floor_ms IS NULL THEN l.acquired_at ELSE claimed_at END,
           renewed_at = claimed_at,
           expires_at = claimed_at + p_ttl_ms * interval '1 millisecond',
           high_water_ms = greatest(l.high_water_ms, p_reserve_until_ms)
     WHERE l.worker_id = p_worker_id
    RETURNING l.high_water_ms, l.holder_name, (extract(epoch FROM l.expires_at) * 1000)::bigint
         INTO reserved_until_ms, holder_name, expires_at_unix_ms;
END
$$;

-- Acquires a lease on any worker id, for servers that do not name one: the one this server holds
-- already, else the lowest one free or expired, else the lowest never used. Pickers take turns.
CREATE FUNCTION snowid.lease_claim_any(
    p_holder text, p_incarnation text, p_holder_name text, p_ttl_ms bigint, p_reserve_until_ms bigint,
    OUT worker_id integer, OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOCK TABLE snowid.worker_lease IN SHARE ROW EXCLUSIVE MODE;
    SELECT l.worker_id INTO worker_id FROM snowid.worker_lease l
     WHERE l.holder = p_holder ORDER BY l.worker_id LIMIT 1;
    IF worker_id IS NULL THEN
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
    SELECT c.granted, c.floor_ms, c.reserved_until_ms, c.holder_name, c.expires_at_unix_ms
      INTO granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms
      FROM snowid.lease_claim(worker_id, p_holder, p_incarnation, p_holder_name, p_ttl_ms, p_reserve_until_ms) c;
END
$$;

-- Releases a lease its holder no longer needs, lowering the high-water mark to just above the ids
-- it really issued. Returns NULL when the caller did not hold it.
CREATE FUNCTION snowid.lease_release(
    p_worker_id integer, p_holder text, p_incarnation text, p_high_water_ms bigint)
RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE snowid.worker_lease
       SET holder = NULL, incarnation = NULL, expires_at = NULL,
           high_water_ms = least(high_water_ms, p_high_water_ms)
     WHERE worker_id = p_worker_id AND holder = p_holder AND incarnation = p_incarnation
    RETURNING true;
$$;

REVOKE ALL ON FUNCTION snowid.lease_claim(integer, text, text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim_any(text, text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_release(integer, text, text, bigint) FROM PUBLIC;

-- snowid_status() gains the lease columns; a function's result type cannot change in place.
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
	last_error text
)
STRICT VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowid_status_wrapper';
