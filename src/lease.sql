-- The lease registry: one row per worker id ever leased. Any role may read it. Only the lease
-- functions write it, for the roles granted EXECUTE on them (a node's registry role needs nothing
-- more), and superusers; a trigger refuses every other role, members of pg_write_all_data
-- included.
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
    high_water_ms bigint NOT NULL DEFAULT 0 CHECK (high_water_ms BETWEEN 0 AND 2199023255552),
    released_by   text,
    released_timeline bigint,
    holder_role   name,
    acquired_mark_ms bigint
);
COMMENT ON TABLE snowid.worker_lease IS 'Which server holds which snowid worker id';
COMMENT ON COLUMN snowid.worker_lease.holder IS 'The holding server (system identifier and a hash of its data directory''s device, inode number and birth time); NULL when free';
COMMENT ON COLUMN snowid.worker_lease.incarnation IS 'The run of the holding server';
COMMENT ON COLUMN snowid.worker_lease.expires_at IS 'When the lease ends unless renewed, by this registry''s clock';
COMMENT ON COLUMN snowid.worker_lease.released_by IS 'The holder that released the lease at its clean shutdown';
COMMENT ON COLUMN snowid.worker_lease.released_timeline IS 'The WAL timeline of the server that released the lease';
COMMENT ON COLUMN snowid.worker_lease.holder_role IS 'The login role the lease was last claimed with; no other role but a superuser may renew it while it runs, or release it';
COMMENT ON COLUMN snowid.worker_lease.acquired_mark_ms IS 'The high-water mark when the holder took the row; releasing the lease never lowers the mark below it';
COMMENT ON COLUMN snowid.worker_lease.high_water_ms IS 'Milliseconds since 2026-01-01 that every id issued under this worker id is below; the next holder starts here';

REVOKE ALL ON snowid.worker_lease FROM PUBLIC;
GRANT USAGE ON SCHEMA snowid TO PUBLIC;
GRANT SELECT ON snowid.worker_lease TO PUBLIC;
-- pg_dump keeps the rows, so that a restored registry keeps every high-water mark.
SELECT pg_catalog.pg_extension_config_dump('snowid.worker_lease', '');

-- The grant rule, from snowid's library (snowid_core::grant, docs/protocol.md): the lease functions
-- below lock a row, call these with it, and write what they answer.
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

-- What the registry knows of its own past. pg_dump leaves this row out on purpose: a registry
-- restored from a dump, like one restarted (a crash, a restored snapshot, a point-in-time recovery,
-- a failover to a standby) or whose lease table was rewritten, finds the row stale, and may have
-- lost the rows of leases that still run. Until every such lease has run out it grants nothing
-- but the renewal of a lease that runs.
CREATE TABLE snowid.registry_epoch (
    only_row       boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    run            text NOT NULL,
    began_at       timestamptz NOT NULL,
    settles_at     timestamptz NOT NULL,
    longest_ttl_ms bigint NOT NULL
);
COMMENT ON TABLE snowid.registry_epoch IS 'Since when the snowid lease registry has run as it is, and until when it grants only running leases';
COMMENT ON COLUMN snowid.registry_epoch.run IS 'The registry server''s start time and the lease table''s file: a change of either begins a new epoch, as does a change of the lease table by anything but the lease functions';
COMMENT ON COLUMN snowid.registry_epoch.settles_at IS 'Until then, only a lease that runs is renewed: every lease granted before the epoch began has run out';
COMMENT ON COLUMN snowid.registry_epoch.longest_ttl_ms IS 'The longest lease claimed from this registry since it was made or restored from a dump, which an epoch lasts at least';
INSERT INTO snowid.registry_epoch (run, began_at, settles_at, longest_ttl_ms)
VALUES ('', '-infinity', '-infinity', 0);
REVOKE ALL ON snowid.registry_epoch FROM PUBLIC;
GRANT SELECT ON snowid.registry_epoch TO PUBLIC;
CREATE TRIGGER registry_epoch_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON snowid.registry_epoch
    FOR EACH STATEMENT EXECUTE FUNCTION snowid.lease_guard();

-- The run of the registry that an epoch belongs to: its server's start, its lease table's file,
-- and its database (a copy made with CREATE DATABASE ... TEMPLATE keeps the file's number).
CREATE FUNCTION snowid.registry_run() RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT extract(epoch FROM pg_postmaster_start_time())::text || ' '
           || pg_relation_filenode('snowid.worker_lease'::regclass)::text || ' '
           || (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())::text
$$;

-- Until when this registry grants only the renewal of a lease that runs, for a claim with the
-- time-to-live p_ttl_ms made at p_now; p_lost when the claim is a server's word that it holds a
-- lease its row does not show, which only a registry that lost rows can do. A new epoch lasts as
-- long as the longest lease the registry knows of (its claims and its rows), so that every lease
-- granted before it ran out first. A registry just created begins one at its first claim too:
-- nothing tells it from one dropped and created again under a running fleet, unless an operator
-- says so (snowid_registry_is_new); only one said to be new settles at once at a restart, while
-- it has had no claim and no mark.
-- One claim at a time writes the row: one that would wait for another takes the registry as
-- settling for its own lease's length, so that no open transaction holds up a renewal.
CREATE FUNCTION snowid.registry_settles_at(p_ttl_ms bigint, p_now timestamptz, p_lost boolean)
RETURNS timestamptz
LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_run text := snowid.registry_run();
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
        -- At once only where nothing was ever claimed: a registry said to be new that restarted
        -- since. Never more than an hour ahead, the longest a lease can be: a registry's clock
        -- that ran ahead for a while leaves no epoch behind that outlasts every lease.
        UPDATE snowid.registry_epoch e
           SET run = current_run, began_at = p_now, longest_ttl_ms = longest,
               settles_at = CASE WHEN p_lost OR e.run = '' OR e.longest_ttl_ms > 0
                                      OR EXISTS (SELECT FROM snowid.worker_lease l WHERE l.high_water_ms > 0)
                                 THEN least(greatest(e.settles_at, p_now + longest * interval '1 millisecond'),
                                            p_now + interval '1 hour')
                                 ELSE p_now END
        RETURNING * INTO epoch;
    ELSE
        UPDATE snowid.registry_epoch e
           SET longest_ttl_ms = longest,
               settles_at = CASE WHEN e.settles_at > p_now
                                 THEN least(greatest(e.settles_at, e.began_at + longest * interval '1 millisecond'),
                                            p_now + interval '1 hour')
                                 ELSE e.settles_at END
        RETURNING * INTO epoch;
    END IF;
    RETURN epoch.settles_at;
END
$$;

-- A change of the lease table that no lease function made (a row deleted or edited by hand, a
-- restore of its rows) may have dropped the row or the mark of a lease that runs: a new epoch
-- begins, as long as the longest lease the registry knows of. The lease functions mark their own
-- changes with the setting snowid_lease.writing.
CREATE FUNCTION snowid.lease_changed() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('snowid_lease.writing', true) IS DISTINCT FROM 'on' THEN
        UPDATE snowid.registry_epoch e
           SET began_at = clock_timestamp(),
               settles_at = least(greatest(e.settles_at, clock_timestamp() + e.longest_ttl_ms * interval '1 millisecond'),
                                  clock_timestamp() + interval '1 hour');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER worker_lease_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON snowid.worker_lease
    FOR EACH STATEMENT EXECUTE FUNCTION snowid.lease_changed();
-- With session_replication_role = replica too (a replication tool, a maintenance script).
ALTER TABLE snowid.worker_lease ENABLE ALWAYS TRIGGER worker_lease_changed;

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

-- Says that this registry was just created for servers that never held a lease from it, so
-- that its first claims need not wait out the leases it might have lost: it settles at once.
-- Refused once any lease row exists or anything was claimed; never true of a registry dropped and
-- created again while its servers run, whose leases it would then grant twice.
CREATE FUNCTION snowid_registry_is_new() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- After every claim under way: one that has not committed yet is seen.
    LOCK TABLE snowid.worker_lease IN SHARE ROW EXCLUSIVE MODE;
    PERFORM FROM snowid.registry_epoch FOR UPDATE;
    IF EXISTS (SELECT FROM snowid.worker_lease)
       OR EXISTS (SELECT FROM snowid.registry_epoch e WHERE e.run <> '' OR e.longest_ttl_ms > 0) THEN
        RAISE EXCEPTION 'the lease registry is not new: it has lease rows, or servers have claimed from it'
            USING ERRCODE = '55000';
    END IF;
    UPDATE snowid.registry_epoch e
       SET run = snowid.registry_run(), began_at = clock_timestamp(), settles_at = clock_timestamp();
END
$$;
COMMENT ON FUNCTION snowid_registry_is_new() IS 'Lets a lease registry just created for a new fleet grant at once';

-- Acquires or renews a lease. Granted when the row is held by the same server (with
-- p_takeover_on_expiry, by the same run of it, or by an earlier run whose lease expired; without,
-- a restart of it takes its lease back at once), is free, or, with p_takeover_on_expiry, is held
-- by another server whose lease expired. A registry in the server's own data directory passes false: it
-- cannot see the renewals of a server whose data directory this one's is a copy of. There a free
-- row that another server released is granted only to a server it cannot be a copy of: one with
-- another system identifier (pg_upgrade), or on a later timeline (a standby promoted after its
-- primary stopped). floor_ms is the row's high-water mark before this claim, above which a new
-- holder starts; `continued` says whether this holder held the row already, `renewal` whether
-- this run of it did, and `tenure` (when this run took the row, in microseconds since 1970) lets it
-- tell a renewal of the grant it applied from one whose first answer it never got; every grant
-- raises the mark to the claimant's reservation, which may lie at most an hour and the lease's
-- time-to-live ahead of this registry's clock, and by at least a millisecond, so that a grant to
-- another copy of the holder's memory shows even while the clocks are behind the mark. The caller's login role holds the lease: a live
-- lease claimed as its holder by another role (a superuser excepted) is refused with 42501. A
-- refusal names the holder; one with no name says that a shared registry in a new epoch (see
-- registry_epoch) grants nothing before expires_at_unix_ms but the renewal of a lease that runs: by
-- its row, or by the word of its holder (p_holding), whose row the registry may have lost.
-- p_known_mark_ms is the highest mark this run of the holder knows of (every reservation it sent,
-- every mark it was answered; -1: it does not say): its claim of a row that names this very run
-- with a higher mark is refused as `fenced`, and leaves the row as it is, since another copy of
-- its memory claimed the row since (a virtual machine resumed from a snapshot of its memory, a
-- running one forked).
CREATE FUNCTION snowid.lease_claim(
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

-- The claim of a server that does not say which mark it knows of (snowid 0.8.0).
CREATE FUNCTION snowid.lease_claim(
    p_worker_id integer, p_holder text, p_incarnation text, p_holder_name text,
    p_ttl_ms bigint, p_reserve_until_ms bigint, p_takeover_on_expiry boolean, p_timeline bigint,
    p_holding boolean,
    OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint)
LANGUAGE sql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.granted, c.floor_ms, c.reserved_until_ms, c.holder_name, c.expires_at_unix_ms,
           c.continued, c.renewal, c.released, c.tenure
      FROM snowid.lease_claim(p_worker_id, p_holder, p_incarnation, p_holder_name, p_ttl_ms,
                              p_reserve_until_ms, p_takeover_on_expiry, p_timeline, p_holding, -1) c
$$;

-- The claim of a server that does not say whether it holds the lease (snowid 0.7.0 and earlier).
CREATE FUNCTION snowid.lease_claim(
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

-- Acquires a lease on any worker id, for servers of a shared registry that do not name one: the
-- one this run of the server holds already (p_held_worker_id, by its word, or else by its row;
-- -1 for none), else the lowest one free or expired, else the lowest never used (a row that
-- another run of this server holds is no one's to take while it runs); a row renewed between its
-- read and its claim is passed over for the next.
-- Servers picking a new one take turns, on a lock of the table that renewals never wait for and
-- that only the roles allowed to claim can take.
-- p_known_mark_ms and fenced are lease_claim's.
CREATE FUNCTION snowid.lease_claim_any(
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

-- The claim of a server that does not say which mark it knows of (snowid 0.8.0).
CREATE FUNCTION snowid.lease_claim_any(
    p_holder text, p_incarnation text, p_holder_name text, p_ttl_ms bigint, p_reserve_until_ms bigint,
    p_timeline bigint, p_held_worker_id integer,
    OUT worker_id integer, OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
    OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
    OUT renewal boolean, OUT released boolean, OUT tenure bigint)
LANGUAGE sql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.worker_id, c.granted, c.floor_ms, c.reserved_until_ms, c.holder_name,
           c.expires_at_unix_ms, c.continued, c.renewal, c.released, c.tenure
      FROM snowid.lease_claim_any(p_holder, p_incarnation, p_holder_name, p_ttl_ms,
                                  p_reserve_until_ms, p_timeline, p_held_worker_id, -1) c
$$;

-- The claim of a server that does not say which lease it holds (snowid 0.7.0 and earlier).
CREATE FUNCTION snowid.lease_claim_any(
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

-- Releases a lease its holder no longer needs, at its clean shutdown, lowering the high-water mark
-- to just above the ids it really issued (never below the mark it took the row at) and recording
-- who released it, on which timeline. Returns NULL when the caller did not hold it, or when the row
-- has a mark above p_known_mark_ms (see lease_claim: the caller is a copy of a run that another
-- copy got ahead of; -1: it does not say); a lease held with another role (a superuser excepted)
-- is refused with 42501, without locking its row.
CREATE FUNCTION snowid.lease_release(
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

-- The release of a server that does not say which mark it knows of (snowid 0.8.0 and earlier).
CREATE FUNCTION snowid.lease_release(
    p_worker_id integer, p_holder text, p_incarnation text, p_high_water_ms bigint,
    p_timeline bigint)
RETURNS boolean
LANGUAGE sql STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT snowid.lease_release(p_worker_id, p_holder, p_incarnation, p_high_water_ms, p_timeline, -1)
$$;

-- Frees a worker id for the next server that claims it, on behalf of a holder that is gone for
-- good (a crashed primary whose standby was promoted, a server retired without a clean shutdown,
-- the original of a copy), keeping the high-water mark: the next holder starts above every id
-- issued under the worker id. Returns the freed holder's name, NULL when the row was free. In a
-- database that holds no registry (no lease row and no claim ever, as on a node whose leases are
-- in a shared registry) it is an error: the operator is in the wrong database.
CREATE FUNCTION snowid_handover(worker_id integer) RETURNS text
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
COMMENT ON FUNCTION snowid_handover(integer) IS 'Frees a worker id whose holder is gone for good';

REVOKE ALL ON FUNCTION snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint, boolean, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim_any(text, text, text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim_any(text, text, text, bigint, bigint, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_claim_any(text, text, text, bigint, bigint, bigint, integer, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_release(integer, text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.lease_release(integer, text, text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid_handover(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.grant_decide(snowid.worker_lease, text, text, boolean, bigint, boolean, bigint, boolean, boolean, bigint, bigint, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.grant_release(snowid.worker_lease, text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid_registry_is_new() FROM PUBLIC;
REVOKE ALL ON FUNCTION snowid.registry_settles_at(bigint, timestamptz, boolean) FROM PUBLIC;
