-- snowid 0.2.0 -> 0.3.0: a registry in the server's own data directory never hands a lease held by
-- another server over on expiry; snowid_handover() for an operator; lease claims say whether the
-- claimant held the row last; the rows survive pg_dump; only superusers and the lease functions
-- write the table; high-water marks stay within the id layout.

ALTER TABLE snowid.worker_lease DROP CONSTRAINT worker_lease_high_water_ms_check;
ALTER TABLE snowid.worker_lease ADD CONSTRAINT worker_lease_high_water_ms_check
    CHECK (high_water_ms BETWEEN 0 AND 2199023255552);
COMMENT ON COLUMN snowid.worker_lease.holder IS 'The holding server (system identifier and a hash of its host, port, data directory path and the data directory''s device and inode numbers); NULL when free';

-- pg_dump keeps the rows, so that a restored registry keeps every high-water mark.
SELECT pg_catalog.pg_extension_config_dump('snowid.worker_lease', '');

CREATE FUNCTION snowid.lease_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pg_catalog.pg_has_role(current_user,
            (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RAISE EXCEPTION 'permission denied to change %: only the snowid lease functions and superusers may', TG_RELID::regclass
            USING ERRCODE = '42501';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER worker_lease_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON snowid.worker_lease
    FOR EACH STATEMENT EXECUTE FUNCTION snowid.lease_guard();

DROP FUNCTION snowid.lease_claim_any(text, text, text, bigint, bigint);
DROP FUNCTION snowid.lease_claim(integer, text, text, text, bigint, bigint);

-- Acquires or renews a lease. Granted when the row is free (never used, or released), held by the
-- same server (a restart of it takes its lease back at once), or, with p_takeover_on_expiry, held
-- by another whose lease expired. A registry in the server's own data directory passes false: it
-- cannot see the renewals of a server it was copied from. A new holder gets the row's high-water
-- mark as the floor of its ids, and `continued` says whether this holder held the row last; every
-- claim raises the mark to the claimant's reservation.
CREATE FUNCTION snowid.lease_claim(
    p_worker_id integer, p_holder text, p_incarnation text, p_holder_name text,
    p_ttl_ms bigint, p_reserve_until_ms bigint, p_takeover_on_expiry boolean,
    OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease snowid.worker_lease;
    claimed_at timestamptz := clock_timestamp();
BEGIN
    INSERT INTO snowid.worker_lease (worker_id) VALUES (p_worker_id) ON CONFLICT DO NOTHING;
    SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id FOR UPDATE;
    IF lease.holder IS NOT NULL AND lease.holder <> p_holder
       AND (NOT p_takeover_on_expiry OR lease.expires_at > claimed_at) THEN
        granted := false;
        holder_name := lease.holder_name;
        expires_at_unix_ms := (extract(epoch FROM lease.expires_at) * 1000)::bigint;
        RETURN;
    END IF;
    granted := true;
    continued := lease.holder IS NOT DISTINCT FROM p_holder;
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
-- already, else the lowest one free (or expired, with p_takeover_on_expiry), else the lowest never
-- used. Pickers take turns.
CREATE FUNCTION snowid.lease_claim_any(
    p_holder text, p_incarnation text, p_holder_name text, p_ttl_ms bigint, p_reserve_until_ms bigint,
    p_takeover_on_expiry boolean,
    OUT worker_id integer, OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOCK TABLE snowid.worker_lease IN SHARE ROW EXCLUSIVE MODE;
    SELECT l.worker_id INTO worker_id FROM snowid.worker_lease l
     WHERE l.holder = p_holder ORDER BY l.worker_id LIMIT 1;
    IF worker_id IS NULL THEN
        SELECT l.worker_id INTO worker_id FROM snowid.worker_lease l
         WHERE l.holder IS NULL OR (p_takeover_on_expiry AND l.expires_at <= clock_timestamp())
         ORDER BY l.worker_id LIMIT 1;
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
    SELECT c.granted, c.floor_ms, c.reserved_until_ms, c.holder_name, c.expires_at_unix_ms, c.continued
      INTO granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, continued
      FROM snowid.lease_claim(worker_id, p_holder, p_incarnation, p_holder_name, p_ttl_ms,
                              p_reserve_until_ms, p_takeover_on_expiry) c;
END
$$;

-- Releases a lease on behalf of a holder that is gone for good (a crashed primary whose standby was
-- promoted, a server retired without a clean shutdown), keeping the high-water mark: the next
-- holder starts above every id issued under the worker id. Returns the released holder's name, NULL
-- when nobody held the worker id.
CREATE FUNCTION snowid_handover(worker_id integer) RETURNS text
LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    released text;
BEGIN
    IF snowid_handover.worker_id NOT BETWEEN 0 AND 1023 THEN
        RAISE EXCEPTION 'worker id must be between 0 and 1023, not %', snowid_handover.worker_id
            USING ERRCODE = '22023';
    END IF;
    UPDATE snowid.worker_lease l
       SET holder = NULL, incarnation = NULL, expires_at = NULL
     WHERE l.worker_id = snowid_handover.worker_id AND l.holder IS NOT NULL
    RETURNING l.holder_name INTO released;
    RETURN released;
END
$$;
COMMENT ON FUNCTION snowid_handover(integer) IS 'Releases a worker id''s lease for a holder that is gone for good';

REVOKE ALL ON FUNCTION snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim_any(text, text, text, bigint, bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_release(integer, text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid_handover(integer) FROM PUBLIC;
