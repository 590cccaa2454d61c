//! The SQL the lease worker runs against a registry, in one place: each function's parameters and
//! the columns read back, by position, into a [`super::ClaimRow`].

/// Claims (acquires or renews) a worker id's lease. Parameters: worker id, holder, incarnation,
/// holder's name, time-to-live in ms, reservation in ms since the snowid epoch, whether an expired
/// lease of another holder may be taken, this server's timeline. One row, read as a [`ClaimRow`].
pub const CLAIM_SQL: &str =
    "SELECT $1::pg_catalog.int4, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure \
     FROM snowid.lease_claim($1, $2, $3, $4, $5, $6, $7, $8)";

/// As `CLAIM_SQL`, with a ninth parameter: whether this server holds the lease and issues under it,
/// which a shared registry that may have lost its row takes its word for (snowid 0.8.0 and later).
pub const CLAIM_HOLDING_SQL: &str =
    "SELECT $1::pg_catalog.int4, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure \
     FROM snowid.lease_claim($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// As `CLAIM_HOLDING_SQL`, with a tenth parameter: the highest mark this run knows of, and an
/// eleventh column: whether the claim was refused as `fenced` (snowid 0.9.0 and later).
pub const CLAIM_FENCED_SQL: &str =
    "SELECT $1::pg_catalog.int4, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure, fenced \
     FROM snowid.lease_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// Claims a lease on any free worker id of a shared registry. Parameters: as `CLAIM_SQL` without
/// the worker id and whether expired leases may be taken (they may). Row: as `CLAIM_SQL`.
pub const CLAIM_ANY_SQL: &str =
    "SELECT worker_id, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure \
     FROM snowid.lease_claim_any($1, $2, $3, $4, $5, $6)";

/// As `CLAIM_ANY_SQL`, with a seventh parameter: the worker id whose lease this server holds and
/// issues under, -1 for none (snowid 0.8.0 and later).
pub const CLAIM_ANY_HOLDING_SQL: &str =
    "SELECT worker_id, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure \
     FROM snowid.lease_claim_any($1, $2, $3, $4, $5, $6, $7)";

/// As `CLAIM_ANY_HOLDING_SQL`, with an eighth parameter and an eleventh column as in
/// `CLAIM_FENCED_SQL` (snowid 0.9.0 and later).
pub const CLAIM_ANY_FENCED_SQL: &str =
    "SELECT worker_id, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure, fenced \
     FROM snowid.lease_claim_any($1, $2, $3, $4, $5, $6, $7, $8)";

/// Whether the registry's claim functions take the lease a server holds (`CLAIM_HOLDING_SQL`,
/// `CLAIM_ANY_HOLDING_SQL`), as the extension made them, and this role may call them.
pub const HOLDING_READY_SQL: &str = "SELECT pg_catalog.count(*) = 2 FROM pg_catalog.pg_depend d \
     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowid' \
     WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e' \
       AND pg_catalog.has_function_privilege(d.objid, 'EXECUTE') \
       AND d.objid IN (\
         pg_catalog.to_regprocedure('snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint, boolean)'), \
         pg_catalog.to_regprocedure('snowid.lease_claim_any(text, text, text, bigint, bigint, bigint, integer)'))";

/// Whether the registry's claim and release functions also take the mark a server knows of
/// (`CLAIM_FENCED_SQL`, `CLAIM_ANY_FENCED_SQL`, `RELEASE_FENCED_SQL`), as the extension made them,
/// and this role may call them.
pub const FENCING_READY_SQL: &str = "SELECT pg_catalog.count(*) = 3 FROM pg_catalog.pg_depend d \
     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowid' \
     WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e' \
       AND pg_catalog.has_function_privilege(d.objid, 'EXECUTE') \
       AND d.objid IN (\
         pg_catalog.to_regprocedure('snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint, boolean, bigint)'), \
         pg_catalog.to_regprocedure('snowid.lease_claim_any(text, text, text, bigint, bigint, bigint, integer, bigint)'), \
         pg_catalog.to_regprocedure('snowid.lease_release(integer, text, text, bigint, bigint, bigint)'))";

/// Who else holds a worker id, for a standby. Parameters: worker id, this server's holder, whether
/// only a lease that runs counts (on a shared registry). Row, if any: the holder's name and holder.
pub const OTHER_HOLDER_SQL: &str =
    "SELECT coalesce(holder_name, holder), holder FROM snowid.worker_lease \
     WHERE worker_id = $1 AND holder IS NOT NULL AND holder <> $2 \
       AND (NOT $3 OR expires_at > pg_catalog.clock_timestamp())";

/// Releases a lease this server holds. Parameters: worker id, holder, incarnation, high-water mark,
/// timeline.
pub const RELEASE_SQL: &str = "SELECT snowid.lease_release($1, $2, $3, $4, $5)";

/// As `RELEASE_SQL`, with a sixth parameter: the highest mark this run knows of, -1 for none
/// (snowid 0.9.0 and later).
pub const RELEASE_FENCED_SQL: &str = "SELECT snowid.lease_release($1, $2, $3, $4, $5, $6)";

/// Whether the registry database has the lease functions of the extension, at 0.3.0 or later: the
/// very functions `CREATE EXTENSION snowid` made, never ones of the same name that a role of that
/// database created, which the worker, running as a superuser, would otherwise run.
pub const READY_SQL: &str = "SELECT pg_catalog.count(*) = 3 FROM pg_catalog.pg_depend d \
     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowid' \
     WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e' \
       AND d.objid IN (\
         pg_catalog.to_regprocedure('snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint)'), \
         pg_catalog.to_regprocedure('snowid.lease_claim_any(text, text, text, bigint, bigint, bigint)'), \
         pg_catalog.to_regprocedure('snowid.lease_release(integer, text, text, bigint, bigint)'))";
