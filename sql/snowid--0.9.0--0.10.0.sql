-- snowid 0.9.0 to 0.10.0: the lease functions call the grant rule in snowid's library
-- (snowid_core::grant), which the etcd registry and the model checker run too; they keep their names
-- and arguments, so that nodes of 0.9.0 and earlier claim from an updated registry as before.
-- snowid_handover() is an error in a database that holds no registry. snowid.lease_claim_any() claims
-- the next free worker id when the one it read as free was renewed by its holder before its claim.
-- snowid's own tables take no change from a logical replication subscription (a publication FOR
-- ALL TABLES on another server).

CREATE FUNCTION snowid.grant_decide(
    lease snowid.worker_lease, holder text, incarnation text, takeover_on_expiry boolean,
    timeline bigint, holding boolean, known_mark_ms bigint, same_role boolean, settling boolean,
    reserve_until_ms bigint, ttl_ms bigint, claimed_at timestamptz)
RETURNS TABLE (decision text, floor_ms bigint, mark_ms bigint, continued boolean, renewal boolean)
LANGUAGE c IMMUTABLE STRICT
AS 'MODULE_PATHNAME', 'grant_decide_wrapper';

CREATE FUNCTION snowid.grant_release(
    lease snowid.worker_lease, holder text, incarnation text, known_mark_ms bigint,
    high_water_ms bigint)
RETURNS bigint
LANGUAGE c IMMUTABLE STRICT
AS 'MODULE_PATHNAME', 'grant_release_wrapper';

CREATE OR REPLACE FUNCTION snowid.lease_claim(
    p_worker_id integer, p_holder text, p_incarnation text, p_holder_name text,
    p_ttl_ms bigint, p_reserve_until_ms bigint, p_takeover_on_expiry boolean, p_timeline bigint,
    p_holding boolean, p_known_mark_ms bigint,
    OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint, OUT fenced boolean)
LANGUAGE plpgsql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET snowid_lease.writing = on
AS $$
DECLARE
    lease snowid.worker_lease;
    claimed_at timestamptz := clock_timestamp();
    locked boolean := false;
    trusted boolean := (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user);
    settles_at timestamptz;
    same_role boolean;
    decision record;
BEGIN
    fenced := false;
    IF p_ttl_ms NOT BETWEEN 1000 AND 3600000 THEN
        RAISE EXCEPTION 'a lease''s time-to-live must be between 1000 and 3600000 ms, not %', p_ttl_ms
            USING ERRCODE = '22023';
    END IF;
    -- The row first: a rewrite of the table (TRUNCATE) then waits for this claim to end, and
    -- comes after the epoch it reads.
    INSERT INTO snowid.worker_lease (worker_id) VALUES (p_worker_id) ON CONFLICT DO NOTHING;
    -- Decided on the row as it stands, then again once locked: a claim that is refused never
    -- locks the row, so that no role can hold up another's renewals by leaving its transaction open.
    LOOP
        IF locked THEN
            SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id FOR UPDATE;
        ELSE
            SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id;
        END IF;
        -- The row was deleted since (by hand, which began an epoch): made again, decided afresh.
        IF NOT FOUND THEN
            INSERT INTO snowid.worker_lease (worker_id) VALUES (p_worker_id) ON CONFLICT DO NOTHING;
            locked := false;
            CONTINUE;
        END IF;
        IF lease.holder = p_holder AND lease.expires_at > claimed_at AND NOT trusted
           AND lease.holder_role IS DISTINCT FROM session_user THEN
            RAISE EXCEPTION 'permission denied for the lease on worker id %: it is held by %',
                p_worker_id, coalesce('role "' || lease.holder_role || '"', 'a role snowid 0.2.0 did not record')
                USING ERRCODE = '42501';
        END IF;
        -- The grant rule (snowid_core::grant::decide), first as if the registry were settled: a
        -- fenced claim changes nothing, the epoch included.
        same_role := coalesce(trusted OR lease.holder_role = session_user, false);
        SELECT * INTO decision FROM snowid.grant_decide(lease, p_holder, p_incarnation,
            p_takeover_on_expiry, p_timeline, p_holding, p_known_mark_ms, same_role, false,
            p_reserve_until_ms, p_ttl_ms, claimed_at);
        IF decision.decision IS DISTINCT FROM 'fenced' AND p_takeover_on_expiry AND NOT locked THEN
            settles_at := snowid.registry_settles_at(p_ttl_ms, claimed_at, p_holding AND NOT EXISTS (
                SELECT FROM snowid.worker_lease l
                 WHERE l.worker_id = p_worker_id AND l.holder = p_holder
                   AND l.incarnation = p_incarnation AND l.expires_at > claimed_at));
        END IF;
        IF decision.decision = 'granted' AND settles_at > claimed_at THEN
            SELECT * INTO decision FROM snowid.grant_decide(lease, p_holder, p_incarnation,
                p_takeover_on_expiry, p_timeline, p_holding, p_known_mark_ms, same_role, true,
                p_reserve_until_ms, p_ttl_ms, claimed_at);
        END IF;
        IF decision.decision IS DISTINCT FROM 'granted' THEN
            granted := false;
            fenced := decision.decision = 'fenced';
            released := decision.decision = 'released';
            IF decision.decision = 'unsettled' THEN
                -- Said with no holder's name.
                expires_at_unix_ms := (extract(epoch FROM settles_at) * 1000)::bigint;
            ELSE
                holder_name := coalesce(lease.holder_name, lease.holder, lease.released_by);
                expires_at_unix_ms := (extract(epoch FROM lease.expires_at) * 1000)::bigint;
            END IF;
            RETURN;
        END IF;
        EXIT WHEN locked;
        locked := true;
    END LOOP;
    granted := true;
    released := lease.holder IS NULL AND lease.released_by IS NOT NULL;
    floor_ms := decision.floor_ms;
    continued := decision.continued;
    renewal := decision.renewal;
    UPDATE snowid.worker_lease l
       SET holder = p_holder, incarnation = p_incarnation, holder_name = p_holder_name,
           acquired_at = CASE WHEN renewal THEN l.acquired_at ELSE claimed_at END,
           renewed_at = claimed_at,
           expires_at = claimed_at + p_ttl_ms * interval '1 millisecond',
           high_water_ms = decision.mark_ms,
           released_by = NULL, released_timeline = NULL, holder_role = session_user,
           acquired_mark_ms = CASE WHEN continued THEN coalesce(l.acquired_mark_ms, l.high_water_ms)
                                   ELSE l.high_water_ms END
     WHERE l.worker_id = p_worker_id
    RETURNING l.high_water_ms, l.holder_name, (extract(epoch FROM l.expires_at) * 1000)::bigint,
              (extract(epoch FROM l.acquired_at) * 1000000)::bigint
         INTO reserved_until_ms, holder_name, expires_at_unix_ms, tenure;
END
$$;

CREATE OR REPLACE FUNCTION snowid.lease_claim_any(
    p_holder text, p_incarnation text, p_holder_name text, p_ttl_ms bigint, p_reserve_until_ms bigint,
    p_timeline bigint, p_held_worker_id integer, p_known_mark_ms bigint,
    OUT worker_id integer, OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint, OUT fenced boolean)
LANGUAGE plpgsql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Claimed by its word: its refusal is this server's to hear.
    own boolean := p_held_worker_id BETWEEN 0 AND 1023;
    passed_over integer[] := '{}';
BEGIN
    IF own THEN
        worker_id := p_held_worker_id;
    ELSE
        SELECT l.worker_id INTO worker_id FROM snowid.worker_lease l
         WHERE l.holder = p_holder
           AND (l.incarnation IS NOT DISTINCT FROM p_incarnation OR l.expires_at <= clock_timestamp())
         ORDER BY l.worker_id LIMIT 1;
    END IF;
    LOOP
        IF worker_id IS NULL THEN
            LOCK TABLE snowid.worker_lease IN SHARE UPDATE EXCLUSIVE MODE;
            SELECT l.worker_id INTO worker_id FROM snowid.worker_lease l
             WHERE (l.holder IS NULL OR l.expires_at <= clock_timestamp())
               AND l.worker_id <> ALL (passed_over)
             ORDER BY l.worker_id LIMIT 1;
        END IF;
        IF worker_id IS NULL THEN
            SELECT min(free.id) INTO worker_id FROM generate_series(0, 1023) AS free(id)
             WHERE NOT EXISTS (SELECT FROM snowid.worker_lease l WHERE l.worker_id = free.id)
               AND free.id <> ALL (passed_over);
        END IF;
        IF worker_id IS NULL THEN
            SELECT false, 'other servers (all 1024 worker ids are leased)', false
              INTO granted, holder_name, fenced;
            RETURN;
        END IF;
        BEGIN
            SELECT c.granted, c.floor_ms, c.reserved_until_ms, c.holder_name, c.expires_at_unix_ms,
                   c.continued, c.renewal, c.released, c.tenure, c.fenced
              INTO granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms,
                   continued, renewal, released, tenure, fenced
              FROM snowid.lease_claim(worker_id, p_holder, p_incarnation, p_holder_name, p_ttl_ms,
                                      p_reserve_until_ms, true, p_timeline, own, p_known_mark_ms) c;
            -- A row read as free that its holder renewed (or another server took) before the claim
            -- read it again is held: the attempt is undone, with any lock it took on the row, and
            -- the next free one claimed.
            IF NOT (own OR granted OR fenced OR holder_name IS NULL) THEN
                RAISE SQLSTATE 'SNPAS';
            END IF;
            RETURN;
        EXCEPTION WHEN SQLSTATE 'SNPAS' THEN
            passed_over := passed_over || worker_id;
            worker_id := NULL;
            floor_ms := NULL;
            reserved_until_ms := NULL;
            expires_at_unix_ms := NULL;
            continued := NULL;
            renewal := NULL;
            released := NULL;
            tenure := NULL;
        END;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION snowid.lease_release(
    p_worker_id integer, p_holder text, p_incarnation text, p_high_water_ms bigint,
    p_timeline bigint, p_known_mark_ms bigint)
RETURNS boolean
LANGUAGE plpgsql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET snowid_lease.writing = on
AS $$
DECLARE
    trusted boolean := (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user);
    lease snowid.worker_lease;
    locked boolean := false;
    mark_ms bigint;
BEGIN
    LOOP
        IF locked THEN
            SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id FOR UPDATE;
        ELSE
            SELECT * INTO lease FROM snowid.worker_lease l WHERE l.worker_id = p_worker_id;
        END IF;
        IF lease.holder IS NOT NULL AND NOT trusted AND lease.holder_role IS DISTINCT FROM session_user THEN
            RAISE EXCEPTION 'permission denied for the lease on worker id %: it is held by %',
                p_worker_id, coalesce('role "' || lease.holder_role || '"', 'a role snowid 0.2.0 did not record')
                USING ERRCODE = '42501';
        END IF;
        -- The release rule (snowid_core::grant::release).
        mark_ms := snowid.grant_release(lease, p_holder, p_incarnation, p_known_mark_ms, p_high_water_ms);
        IF mark_ms IS NULL THEN
            RETURN NULL;
        END IF;
        EXIT WHEN locked;
        locked := true;
    END LOOP;
    UPDATE snowid.worker_lease l
       SET holder = NULL, incarnation = NULL, expires_at = NULL, high_water_ms = mark_ms,
           released_by = p_holder, released_timeline = p_timeline
     WHERE l.worker_id = p_worker_id;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION snowid_handover(worker_id integer) RETURNS text
LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp
SET snowid_lease.writing = on
AS $$
DECLARE
    freed text;
BEGIN
    IF snowid_handover.worker_id NOT BETWEEN 0 AND 1023 THEN
        RAISE EXCEPTION 'worker id must be between 0 and 1023, not %', snowid_handover.worker_id
            USING ERRCODE = '22023';
    END IF;
    UPDATE snowid.worker_lease l
       SET holder = NULL, incarnation = NULL, expires_at = NULL,
           released_by = NULL, released_timeline = NULL
     WHERE l.worker_id = snowid_handover.worker_id
       AND (l.holder IS NOT NULL OR l.released_by IS NOT NULL)
    RETURNING l.holder_name INTO freed;
    IF NOT FOUND AND NOT EXISTS (SELECT FROM snowid.worker_lease)
       AND NOT EXISTS (SELECT FROM snowid.registry_epoch e WHERE e.run <> '' OR e.longest_ttl_ms > 0) THEN
        RAISE EXCEPTION 'database "%" holds no snowid lease registry: no server has claimed a worker id here',
            current_database()
            USING ERRCODE = '55000',
                  HINT = 'Call snowid_handover() where the lease is: in the database snowid.database names on a server that leases from its own table, in the shared registry''s database, or, with etcd, nowhere (its lease runs out by itself).';
    END IF;
    RETURN freed;
END
$$;

REVOKE ALL ON FUNCTION snowid.grant_decide(snowid.worker_lease, text, text, boolean, bigint, boolean, bigint, boolean, boolean, bigint, bigint, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.grant_release(snowid.worker_lease, text, text, bigint, bigint) FROM PUBLIC;

-- snowid's tables belong to the server that holds them. A publication FOR ALL TABLES publishes
-- them too; a subscriber with snowid skips, with a WARNING, every row of them that its
-- subscription's worker (whose pid pg_stat_subscription shows) would write, so that another
-- server's leases and epoch never land in its registry, and refuses a TRUNCATE of them. A
-- publisher's live lease on a worker id that its own table leases to another server has a
-- WARNING of its own: two servers with one worker id. The triggers fire only with
-- session_replication_role = replica, as subscriptions apply changes; a maintenance session in
-- that role writes the tables as before.
CREATE FUNCTION snowid.keep_local() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    leased_here_to text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_stat_subscription WHERE pid = pg_backend_pid()) THEN
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    ELSIF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'snowid: %.% belongs to this server: a TRUNCATE of it from a subscription is refused',
            TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = '55000',
                  HINT = 'Publish the tables to replicate by name or schema, or FOR ALL TABLES WITH (publish = ''insert, update, delete''). ALTER SUBSCRIPTION ... SKIP skips the whole transaction, with any other table''s changes in it.';
    END IF;
    IF TG_TABLE_NAME = 'worker_lease' AND TG_OP <> 'DELETE' THEN
        -- A publisher's live lease on a worker id that this table leases to another server: two
        -- servers with one worker id, whose rows meet here.
        SELECT l.holder_name INTO leased_here_to FROM snowid.worker_lease l
         WHERE l.worker_id = NEW.worker_id AND l.holder <> NEW.holder
           AND l.expires_at > clock_timestamp() AND NEW.expires_at > clock_timestamp();
        IF FOUND THEN
            RAISE WARNING 'snowid: worker id % is leased to % in a publisher''s lease table and to % in this server''s: the two servers can issue the same ids; the row from the subscription is skipped',
                NEW.worker_id, NEW.holder_name, leased_here_to
                USING HINT = 'Give one of the two servers another snowid.worker_id and restart it. Ids the two issued under worker id ' || NEW.worker_id || ' may already be the same.';
            RETURN NULL;
        END IF;
    END IF;
    RAISE WARNING 'snowid: % of a row of %.% from a subscription skipped: snowid''s tables belong to this server',
        TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING HINT = 'Publish the tables to replicate by name or schema; move a lease registry with pg_dump and pg_restore.';
    RETURN NULL;
END
$$;
CREATE TRIGGER worker_lease_stays_local BEFORE INSERT OR UPDATE OR DELETE ON snowid.worker_lease
    FOR EACH ROW EXECUTE FUNCTION snowid.keep_local();
CREATE TRIGGER worker_lease_truncate_stays_local BEFORE TRUNCATE ON snowid.worker_lease
    FOR EACH STATEMENT EXECUTE FUNCTION snowid.keep_local();
CREATE TRIGGER registry_epoch_stays_local BEFORE INSERT OR UPDATE OR DELETE ON snowid.registry_epoch
    FOR EACH ROW EXECUTE FUNCTION snowid.keep_local();
CREATE TRIGGER registry_epoch_truncate_stays_local BEFORE TRUNCATE ON snowid.registry_epoch
    FOR EACH STATEMENT EXECUTE FUNCTION snowid.keep_local();
ALTER TABLE snowid.worker_lease ENABLE REPLICA TRIGGER worker_lease_stays_local;
ALTER TABLE snowid.worker_lease ENABLE REPLICA TRIGGER worker_lease_truncate_stays_local;
ALTER TABLE snowid.registry_epoch ENABLE REPLICA TRIGGER registry_epoch_stays_local;
ALTER TABLE snowid.registry_epoch ENABLE REPLICA TRIGGER registry_epoch_truncate_stays_local;
