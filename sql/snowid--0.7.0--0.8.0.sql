-- snowid 0.7.0 -> 0.8.0: a shared registry that may have lost the rows of leases that run (it was
-- restored, restarted, failed over, or its lease table rewritten) grants nothing but renewals
-- until every lease granted before has run out, and refuses every other claim meanwhile without
-- naming a holder. A server renewing says whether it holds the lease (lease_claim's p_holding,
-- lease_claim_any's p_held_worker_id), so that one whose row was lost keeps it; the claim
-- functions of 0.7.0 stay, for servers that do not say. A refusal that finds a holder always names
-- one. Every lease row and mark stays.

CREATE TABLE snowid.registry_epoch (
    only_row       boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    run            text NOT NULL,
    began_at       timestamptz NOT NULL,
    settles_at     timestamptz NOT NULL,
    longest_ttl_ms bigint NOT NULL
);
COMMENT ON TABLE snowid.registry_epoch IS 'Since when the snowid lease registry has run as it is, and until when it grants only running leases';
COMMENT ON COLUMN snowid.registry_epoch.run IS 'The registry server''s start time and the lease table''s file: a change of either begins a new epoch';
COMMENT ON COLUMN snowid.registry_epoch.settles_at IS 'Until then, only a lease that runs is renewed: every lease granted before the epoch began has run out';
COMMENT ON COLUMN snowid.registry_epoch.longest_ttl_ms IS 'The longest lease claimed from this registry since it was made or restored from a dump, which an epoch lasts at least';
INSERT INTO snowid.registry_epoch (run, began_at, settles_at, longest_ttl_ms)
VALUES ('', '-infinity', '-infinity', 0);
REVOKE ALL ON snowid.registry_epoch FROM PUBLIC;
GRANT SELECT ON snowid.registry_epoch TO PUBLIC;
CREATE TRIGGER registry_epoch_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON snowid.registry_epoch
    FOR EACH STATEMENT EXECUTE FUNCTION snowid.lease_guard();

CREATE FUNCTION snowid.registry_settles_at(p_ttl_ms bigint, p_now timestamptz, p_lost boolean)
RETURNS timestamptz
LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_run text := extract(epoch FROM pg_postmaster_start_time())::text || ' '
                        || pg_relation_filenode('snowid.worker_lease'::regclass)::text;
    epoch snowid.registry_epoch;
    longest bigint;
BEGIN
    SELECT * INTO epoch FROM snowid.registry_epoch;
    IF epoch.run = current_run AND NOT (p_lost AND epoch.settles_at <= p_now)
       AND p_ttl_ms <= epoch.longest_ttl_ms THEN
        RETURN epoch.settles_at;
    END IF;
    IF NOT FOUND THEN
        INSERT INTO snowid.registry_epoch (run, began_at, settles_at, longest_ttl_ms)
        VALUES ('', '-infinity', '-infinity', 0) ON CONFLICT DO NOTHING;
    END IF;
    BEGIN
        SELECT * INTO epoch FROM snowid.registry_epoch FOR UPDATE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN greatest(epoch.settles_at, p_now + p_ttl_ms * interval '1 millisecond');
    END;
    longest := greatest(epoch.longest_ttl_ms, p_ttl_ms);
    IF epoch.run IS DISTINCT FROM current_run OR (p_lost AND epoch.settles_at <= p_now) THEN
        longest := greatest(longest, (SELECT max((extract(epoch FROM l.expires_at - l.renewed_at) * 1000)::bigint)
                                        FROM snowid.worker_lease l));
        UPDATE snowid.registry_epoch e
           SET run = current_run, began_at = p_now, longest_ttl_ms = longest,
               settles_at = CASE WHEN EXISTS (SELECT FROM snowid.worker_lease l WHERE l.high_water_ms > 0)
                                 THEN p_now + longest * interval '1 millisecond' ELSE p_now END
        RETURNING * INTO epoch;
    ELSE
        UPDATE snowid.registry_epoch e
           SET longest_ttl_ms = longest,
               settles_at = CASE WHEN e.settles_at > p_now
                                 THEN greatest(e.settles_at, e.began_at + longest * interval '1 millisecond')
                                 ELSE e.settles_at END
        RETURNING * INTO epoch;
    END IF;
    RETURN epoch.settles_at;
END
$$;

CREATE FUNCTION snowid.lease_claim(
    p_worker_id integer, p_holder text, p_incarnation text, p_holder_name text,
    p_ttl_ms bigint, p_reserve_until_ms bigint, p_takeover_on_expiry boolean, p_timeline bigint,
    p_holding boolean,
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
    settles_at timestamptz;
BEGIN
    IF p_ttl_ms NOT BETWEEN 1000 AND 3600000 THEN
        RAISE EXCEPTION 'a lease''s time-to-live must be between 1000 and 3600000 ms, not %', p_ttl_ms
            USING ERRCODE = '22023';
    END IF;
    p_reserve_until_ms := least(p_reserve_until_ms,
        (extract(epoch FROM claimed_at) * 1000)::bigint - 1767225600000 + p_ttl_ms + 3600000);
    -- The row first: a rewrite of the table (TRUNCATE) then waits for this claim to end, and
    -- comes after the epoch it reads.
    INSERT INTO snowid.worker_lease (worker_id) VALUES (p_worker_id) ON CONFLICT DO NOTHING;
    IF p_takeover_on_expiry THEN
        settles_at := snowid.registry_settles_at(p_ttl_ms, claimed_at, p_holding AND NOT EXISTS (
            SELECT FROM snowid.worker_lease l
             WHERE l.worker_id = p_worker_id AND l.holder = p_holder
               AND l.incarnation = p_incarnation AND l.expires_at > claimed_at));
    END IF;
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
            holder_name := coalesce(lease.holder_name, lease.holder, lease.released_by);
            expires_at_unix_ms := (extract(epoch FROM lease.expires_at) * 1000)::bigint;
            RETURN;
        END IF;
        -- A shared registry in a new epoch may have lost the rows of leases that run: it renews a
        -- lease that runs, by its row or by its holder's word, and grants nothing else before it
        -- settles, which it says with no holder's name.
        IF settles_at > claimed_at AND NOT p_holding
           AND (lease.holder = p_holder AND lease.incarnation = p_incarnation
                AND lease.expires_at > claimed_at) IS NOT TRUE THEN
            granted := false;
            expires_at_unix_ms := (extract(epoch FROM settles_at) * 1000)::bigint;
            released := false;
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

CREATE OR REPLACE FUNCTION snowid.lease_claim(
    p_worker_id integer, p_holder text, p_incarnation text, p_holder_name text,
    p_ttl_ms bigint, p_reserve_until_ms bigint, p_takeover_on_expiry boolean, p_timeline bigint,
    OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint)
LANGUAGE sql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM snowid.lease_claim(p_worker_id, p_holder, p_incarnation, p_holder_name, p_ttl_ms,
                                     p_reserve_until_ms, p_takeover_on_expiry, p_timeline, false)
$$;

CREATE FUNCTION snowid.lease_claim_any(
    p_holder text, p_incarnation text, p_holder_name text, p_ttl_ms bigint, p_reserve_until_ms bigint,
    p_timeline bigint, p_held_worker_id integer,
    OUT worker_id integer, OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint)
LANGUAGE plpgsql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_held_worker_id BETWEEN 0 AND 1023 THEN
        worker_id := p_held_worker_id;
    ELSE
        SELECT l.worker_id INTO worker_id FROM snowid.worker_lease l
         WHERE l.holder = p_holder
           AND (l.incarnation IS NOT DISTINCT FROM p_incarnation OR l.expires_at <= clock_timestamp())
         ORDER BY l.worker_id LIMIT 1;
    END IF;
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
                              p_reserve_until_ms, true, p_timeline,
                              worker_id = p_held_worker_id) c;
END
$$;

CREATE OR REPLACE FUNCTION snowid.lease_claim_any(
    p_holder text, p_incarnation text, p_holder_name text, p_ttl_ms bigint, p_reserve_until_ms bigint,
    p_timeline bigint,
    OUT worker_id integer, OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint)
LANGUAGE sql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM snowid.lease_claim_any(p_holder, p_incarnation, p_holder_name, p_ttl_ms,
                                         p_reserve_until_ms, p_timeline, -1)
$$;

REVOKE ALL ON FUNCTION snowid.registry_settles_at(bigint, timestamptz, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim_any(text, text, text, bigint, bigint, bigint, integer) FROM PUBLIC;
