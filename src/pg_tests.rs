//! `#[pg_test]`s: the SQL surface inside a server that preloads snowid with `snowid.worker_id = 17`
//! (see `pg_test::postgresql_conf_options` in lib.rs). They run in parallel against one server, so
//! none assumes it is the only one issuing ids.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// The SQLSTATE and message of the error a statement raises, caught in a subtransaction.
    fn error_of(statement: &str) -> String {
        Spi::run(
            "DO $$ BEGIN
             IF to_regproc('pg_temp.error_of') IS NULL THEN
             CREATE FUNCTION pg_temp.error_of(statement text) RETURNS text LANGUAGE plpgsql AS $body$
             DECLARE hint text;
             BEGIN
                 EXECUTE statement;
                 RETURN 'no error';
             EXCEPTION WHEN OTHERS THEN
                 GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
                 RETURN SQLSTATE || ': ' || SQLERRM || coalesce(' HINT: ' || nullif(hint, ''), '');
             END $body$;
             END IF;
             END $$",
        )
        .unwrap();
        Spi::get_one_with_args("SELECT pg_temp.error_of($1)", &[statement.into()])
            .unwrap()
            .unwrap()
    }

    /// Waits up to 10 s for the lease worker to hold the lease, so that ids can be issued.
    fn wait_for_lease() {
        assert!(one::<bool>("SELECT snowid_wait_ready('10 seconds')"));
    }

    fn one<T: pgrx::IntoDatum + pgrx::FromDatum>(query: &str) -> T {
        Spi::get_one(query).unwrap().expect("a non-null result")
    }

    fn assert_one<T, E>(query: &str, expected: E)
    where
        T: pgrx::IntoDatum + pgrx::FromDatum + PartialEq<E> + std::fmt::Debug,
        E: std::fmt::Debug,
    {
        assert_eq!(one::<T>(query), expected, "{query}");
    }

    #[pg_test]
    fn next_carries_the_configured_worker_id_and_the_current_millisecond() {
        wait_for_lease();
        assert_one::<i32, i32>("SELECT snowid_worker_id(snowid_next())", 17);
        let lag: bool = one(
            "SELECT clock_timestamp() - snowid_timestamp(id) BETWEEN interval '0' AND interval '1 second'
               FROM (SELECT snowid_next() AS id) s",
        );
        assert!(lag);
    }

    #[pg_test]
    fn next_increases_strictly_and_never_runs_ahead_of_the_clock() {
        wait_for_lease();
        let checks: (Option<i64>, Option<i64>, Option<i64>) = Spi::get_three(
            "WITH issued AS (
                 SELECT n, snowid_next() AS id, clock_timestamp() AS clock
                   FROM (SELECT generate_series(1, 200000) AS n) s)
             SELECT count(DISTINCT id),
                    count(*) FILTER (WHERE snowid_timestamp(id) > clock),
                    count(*) FILTER (WHERE id <= previous)
               FROM (SELECT id, clock, lag(id) OVER (ORDER BY n) AS previous FROM issued) t",
        )
        .unwrap();
        assert_eq!(checks, (Some(200_000), Some(0), Some(0)));
    }

    #[pg_test]
    fn batch_returns_exactly_count_increasing_ids() {
        wait_for_lease();
        let checks: (Option<i64>, Option<i64>, Option<i64>) = Spi::get_three(
            "WITH batch AS (SELECT id, row_number() OVER () AS n FROM snowid_next_batch(100000) id)
             SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE id <= previous)
               FROM (SELECT id, lag(id) OVER (ORDER BY n) AS previous FROM batch) t",
        )
        .unwrap();
        assert_eq!(checks, (Some(100_000), Some(100_000), Some(0)));
        assert_one::<i64, i64>("SELECT count(*) FROM snowid_next_batch(1)", 1);
        let after: bool = one("SELECT max(b) < snowid_next() FROM snowid_next_batch(5000) b");
        assert!(after, "ids issued after a batch are above all of it");
        assert_one::<i64, i64>(
            "SELECT count(DISTINCT snowid_worker_id(b)) FROM snowid_next_batch(4096) b",
            1,
        );
    }

    #[pg_test]
    fn batch_rejects_counts_out_of_range() {
        assert_eq!(
            error_of("SELECT snowid_next_batch(0)"),
            "22023: snowid_next_batch count must be between 1 and 4096000, not 0"
        );
        assert_eq!(
            error_of("SELECT snowid_next_batch(-5)"),
            "22023: snowid_next_batch count must be between 1 and 4096000, not -5"
        );
        assert_eq!(
            error_of("SELECT snowid_next_batch(4096001)"),
            "22023: snowid_next_batch count must be between 1 and 4096000, not 4096001"
        );
        assert_one::<i64, i64>("SELECT count(*) FROM snowid_next_batch(NULL)", 0);
    }

    #[pg_test]
    fn decode_takes_an_id_apart() {
        let decoded: (Option<String>, Option<i32>, Option<i32>) = Spi::get_three(
            "SELECT created_at AT TIME ZONE 'UTC' || '', worker_id, sequence FROM snowid_decode(120493965312069635)",
        )
        .unwrap();
        assert_eq!(
            decoded,
            (Some("2026-11-29 12:00:00".into()), Some(17), Some(3))
        );
        assert_one::<String, &str>(
            "SELECT snowid_timestamp(0) AT TIME ZONE 'UTC' || ''",
            "2026-01-01 00:00:00",
        );
        assert_one::<String, &str>(
            "SELECT snowid_timestamp(9223372036854775807) AT TIME ZONE 'UTC' || ''",
            "2095-09-07 15:47:35.551",
        );
        assert_one::<i32, i32>("SELECT snowid_worker_id(9223372036854775807)", 1023);
        assert_one::<i32, i32>("SELECT snowid_sequence(9223372036854775807)", 4095);
        assert_one::<i32, i32>("SELECT snowid_worker_id(120493965312069635)", 17);
        assert_one::<i32, i32>("SELECT snowid_sequence(120493965312069635)", 3);
    }

    #[pg_test]
    fn decode_family_is_null_in_null_out() {
        for function in [
            "snowid_timestamp",
            "snowid_worker_id",
            "snowid_sequence",
            "snowid_from_timestamp",
        ] {
            let null: bool = one(&format!("SELECT {function}(NULL) IS NULL"));
            assert!(null, "{function}(NULL)");
        }
        let null: bool = one("SELECT (snowid_decode(NULL)).worker_id IS NULL");
        assert!(null);
    }

    #[pg_test]
    fn decode_family_rejects_negative_ids() {
        for function in [
            "snowid_timestamp",
            "snowid_worker_id",
            "snowid_sequence",
            "snowid_decode",
        ] {
            assert_eq!(
                error_of(&format!("SELECT {function}(-1)")),
                "22023: -1 is not a snowid id: ids are never negative"
            );
        }
        assert_eq!(
            error_of("SELECT snowid_timestamp(-9223372036854775808)"),
            "22023: -9223372036854775808 is not a snowid id: ids are never negative"
        );
    }

    #[pg_test]
    fn decode_family_is_immutable_strict_and_parallel_safe() {
        let markings: i64 = one(
            "SELECT count(*) FROM pg_proc
              WHERE proname IN ('snowid_decode', 'snowid_timestamp', 'snowid_worker_id', 'snowid_sequence',
                                'snowid_from_timestamp', 'snowid_to_base32', 'snowid_from_base32')
                AND provolatile = 'i' AND proisstrict AND proparallel = 's'",
        );
        assert_eq!(markings, 7);
        let volatile: i64 = one(
            "SELECT count(*) FROM pg_proc
              WHERE proname IN ('snowid_next', 'snowid_next_batch', 'snowid_status', 'snowid_wait_ready', 'snowid_convert_column')
                AND provolatile = 'v'",
        );
        assert_eq!(volatile, 5);
    }

    #[pg_test]
    fn signatures_are_the_public_api() {
        let signatures: String = one(
            "SELECT string_agg(format('%s(%s) -> %s', proname, pg_get_function_arguments(oid), pg_get_function_result(oid)), E'\\n' ORDER BY proname)
               FROM pg_proc WHERE proname LIKE 'snowid\\_%'",
        );
        let expected = [
            "snowid_convert_column(table_name regclass, column_name name DEFAULT 'id'::name) -> void",
            "snowid_decode(id bigint, OUT created_at timestamp with time zone, OUT worker_id integer, OUT sequence integer) -> record",
            "snowid_from_base32(t text) -> bigint",
            "snowid_from_timestamp(ts timestamp with time zone) -> bigint",
            "snowid_handover(worker_id integer) -> text",
            "snowid_next() -> bigint",
            "snowid_next_batch(count integer) -> SETOF bigint",
            "snowid_refusals() -> TABLE(reason text, calls bigint)",
            "snowid_registry_is_new() -> void",
            "snowid_sequence(id bigint) -> integer",
            "snowid_status() -> TABLE(worker_id integer, last_id bigint, ids_issued bigint, clock_backward_waits bigint, clock_backward_refusals bigint, sequence_overflow_waits bigint, lease_state text, lease_holder text, lease_expires_at timestamp with time zone, registry text, high_water_mark timestamp with time zone, last_error text, ceiling_waits bigint, refused_calls bigint, lease_held boolean, lease_seconds_left double precision, in_recovery boolean, worker_id_held_by text)",
            "snowid_timestamp(id bigint) -> timestamp with time zone",
            "snowid_to_base32(id bigint) -> text",
            "snowid_wait_ready(timeout interval DEFAULT '00:00:30'::interval) -> boolean",
            "snowid_worker_id(id bigint) -> integer",
        ];
        assert_eq!(signatures, expected.join("\n"));
    }

    #[pg_test]
    fn base32_round_trips_and_sorts_as_the_ids_do() {
        // 10,001 ids spread evenly from 0 to the largest bigint, and 1,000 fresh ones.
        wait_for_lease();
        let checked: String = one(
            "WITH ids AS (
                 SELECT (9223372036854775807::numeric * g / 10000)::bigint AS id FROM generate_series(0, 10000) g
                 UNION ALL SELECT snowid_next_batch(1000)),
             texts AS (SELECT id, snowid_to_base32(id) AS t FROM ids)
             SELECT format('%s %s %s %s %s', count(*),
                           count(*) FILTER (WHERE snowid_from_base32(t) = id),
                           count(*) FILTER (WHERE snowid_from_base32(lower(t)) = id),
                           count(*) FILTER (WHERE length(t) = 13 AND t ~ '^[0-7][0-9A-HJKMNP-TV-Z]{12}$'),
                           (SELECT array_agg(id ORDER BY t COLLATE \"C\") = array_agg(id ORDER BY id) FROM texts))
               FROM texts",
        );
        assert_eq!(checked, "11001 11001 11001 11001 t");
        let ends: String = one(
            "SELECT concat_ws(' ', snowid_to_base32(0), snowid_to_base32(120493965312069635),
                              snowid_to_base32(9223372036854775807), snowid_from_base32('03B0MKY002403'),
                              snowid_from_base32('0oIiLl0000000'), snowid_from_base32('7zzzzzzzzzzzz'))",
        );
        assert_eq!(
            ends,
            "0000000000000 03B0MKY002403 7ZZZZZZZZZZZZ 120493965312069635 1162218150297600 9223372036854775807"
        );
    }

    #[pg_test]
    fn base32_rejects_what_is_not_an_id() {
        const HINT: &str =
            " HINT: An id's base32 text is 13 of the digits 0-9 and the letters A-Z \
            other than U, in either case; I and L read as 1, O as 0.";
        let cases = [
            ("''", "22P02: invalid snowid base32 text: it has 0 characters, not 13"),
            ("'03B0MKY00240'", "22P02: invalid snowid base32 text: it has 12 characters, not 13"),
            ("'03B0MKY0024030'", "22P02: invalid snowid base32 text: it has 14 characters, not 13"),
            ("'03B0MKY00240é'", "22P02: invalid snowid base32 text \"03B0MKY00240é\": \"é\" at position 13 is not a base32 digit"),
            ("'03B0UKY002403'", "22P02: invalid snowid base32 text \"03B0UKY002403\": \"U\" at position 5 is not a base32 digit"),
            ("'03B0MKY00-403'", "22P02: invalid snowid base32 text \"03B0MKY00-403\": \"-\" at position 10 is not a base32 digit"),
            ("' 3B0MKY002403'", "22P02: invalid snowid base32 text \" 3B0MKY002403\": \" \" at position 1 is not a base32 digit"),
            ("'8000000000000'", "22P02: snowid base32 text \"8000000000000\" is out of range for type bigint: its first character must be 0 to 7"),
            ("'zzzzzzzzzzzzz'", "22P02: snowid base32 text \"zzzzzzzzzzzzz\" is out of range for type bigint: its first character must be 0 to 7"),
        ];
        for (text, expected) in cases {
            assert_eq!(
                error_of(&format!("SELECT snowid_from_base32({text})")),
                format!("{expected}{HINT}"),
                "{text}"
            );
        }
        assert_eq!(
            error_of("SELECT snowid_to_base32(-1)"),
            "22023: -1 is not a snowid id: ids are never negative"
        );
        let nulls: bool =
            one("SELECT snowid_to_base32(NULL) IS NULL AND snowid_from_base32(NULL) IS NULL");
        assert!(nulls);
    }

    #[pg_test]
    fn wait_ready_answers_at_once_when_leased_and_rejects_a_negative_timeout() {
        wait_for_lease();
        let answers: String = one(
            "SELECT concat_ws(' ', snowid_wait_ready(), snowid_wait_ready('0'),
                              snowid_wait_ready('1000000 years'), snowid_wait_ready(NULL) IS NULL)",
        );
        assert_eq!(answers, "t t t t");
        assert_eq!(
            error_of("SELECT snowid_wait_ready('-1 second')"),
            "22023: snowid_wait_ready timeout must not be negative, not -00:00:01"
        );
        assert_eq!(
            error_of("SELECT snowid_wait_ready('1 day -25 hours')"),
            "22023: snowid_wait_ready timeout must not be negative, not 1 day -25:00:00"
        );
    }

    #[pg_test]
    fn from_timestamp_gives_the_first_id_of_the_millisecond() {
        wait_for_lease();
        assert_one::<i64, i64>("SELECT snowid_from_timestamp('2026-01-01 00:00:00+00')", 0);
        assert_one::<i64, i64>(
            "SELECT snowid_from_timestamp('2026-11-29 12:00:00.0005+00')",
            120_493_965_312_000_000,
        );
        assert_one::<i64, i64>(
            "SELECT snowid_from_timestamp('2095-09-07 15:47:35.551999+00')",
            9_223_372_036_850_581_504,
        );
        let covers: bool = one("SELECT snowid_from_timestamp(snowid_timestamp(id)) <= id
                AND id < snowid_from_timestamp(snowid_timestamp(id) + interval '1 millisecond')
               FROM (SELECT snowid_next() AS id) s");
        assert!(covers);
    }

    #[pg_test]
    fn from_timestamp_ranges_select_the_ids_made_in_them() {
        Spi::run(
            "CREATE TEMP TABLE made (id bigint PRIMARY KEY);
             INSERT INTO made VALUES (snowid_from_timestamp('2026-06-01 00:00:00+00') - 1),
                                     (snowid_from_timestamp('2026-06-01 00:00:00+00')),
                                     (snowid_from_timestamp('2026-06-01 23:59:59.999+00') + 4194303),
                                     (snowid_from_timestamp('2026-06-02 00:00:00+00'));",
        )
        .unwrap();
        let inside: i64 = one(
            "SELECT count(*) FROM made
              WHERE id >= snowid_from_timestamp('2026-06-01') AND id < snowid_from_timestamp('2026-06-02')",
        );
        assert_eq!(inside, 2);
        Spi::run("SET LOCAL enable_seqscan = off").unwrap();
        let plan = Spi::connect(|client| {
            let rows = client
                .select(
                    "EXPLAIN (COSTS OFF) SELECT * FROM made
                      WHERE id >= snowid_from_timestamp('2026-06-01') AND id < snowid_from_timestamp('2026-06-02')",
                    None,
                    &[],
                )
                .unwrap();
            rows.map(|row| row.get::<String>(1).unwrap().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        });
        assert!(plan.contains("made_pkey"), "{plan}");
    }

    #[pg_test]
    fn from_timestamp_rejects_timestamps_without_ids() {
        assert_eq!(
            error_of("SELECT snowid_from_timestamp('2025-12-31 23:59:59.999999+00')"),
            "22008: timestamp is before 2026-01-01 00:00:00 UTC, the first that snowid ids hold"
        );
        assert_eq!(
            error_of("SELECT snowid_from_timestamp('2095-09-07 15:47:35.552+00')"),
            "22008: timestamp is after 2095-09-07 15:47:35.551 UTC, the last that snowid ids hold"
        );
        let infinite =
            "22008: snowid ids do not reach an infinite timestamp HINT: Use a finite timestamp \
                        from 2026-01-01 00:00:00 UTC to 2095-09-07 15:47:35.551 UTC.";
        assert_eq!(
            error_of("SELECT snowid_from_timestamp('infinity')"),
            infinite
        );
        assert_eq!(
            error_of("SELECT snowid_from_timestamp('-infinity')"),
            infinite
        );
    }

    #[pg_test]
    fn status_describes_the_shared_generator() {
        wait_for_lease();
        let before: i64 = one("SELECT ids_issued FROM snowid_status()");
        let id: i64 = one("SELECT snowid_next()");
        let status: (Option<i32>, Option<i64>, Option<i64>) =
            Spi::get_three("SELECT worker_id, last_id, ids_issued FROM snowid_status()").unwrap();
        assert_eq!(status.0, Some(17));
        assert!(
            status.1.unwrap() >= id,
            "last_id is the newest id of any backend"
        );
        assert!(status.2.unwrap() > before);
        assert_one::<i64, i64>("SELECT count(*) FROM snowid_status()", 1);
        let counters: bool = one(
            "SELECT clock_backward_waits >= 0 AND clock_backward_refusals = 0 AND sequence_overflow_waits >= 0 FROM snowid_status()",
        );
        assert!(counters);
    }

    #[pg_test]
    fn settings_cannot_be_changed_by_a_session() {
        assert_eq!(
            error_of("SET snowid.worker_id = 5"),
            "55P02: parameter \"snowid.worker_id\" cannot be changed without restarting the server"
        );
        assert_eq!(
            error_of("SET snowid.max_clock_backward = 100"),
            "55P02: parameter \"snowid.max_clock_backward\" cannot be changed now"
        );
        assert_eq!(
            error_of("SELECT set_config('snowid.worker_id', '5', false)"),
            "55P02: parameter \"snowid.worker_id\" cannot be changed without restarting the server"
        );
        assert_one::<String, &str>("SHOW snowid.worker_id", "17");
        assert_one::<String, &str>("SHOW snowid.max_clock_backward", "5ms");
    }

    #[pg_test]
    fn the_snowid_setting_prefix_is_reserved() {
        assert_eq!(
            error_of("SET snowid.workerid = 5"),
            "42602: invalid configuration parameter name \"snowid.workerid\""
        );
    }

    #[pg_test]
    fn status_shows_the_lease_held_on_this_server() {
        wait_for_lease();
        let row: (Option<String>, Option<String>, Option<String>) =
            Spi::get_three("SELECT lease_state, registry, last_error FROM snowid_status()")
                .unwrap();
        assert_eq!(
            row,
            (
                Some("held".into()),
                Some("database \"pgrx_tests\" on this server: no other server is checked".into()),
                None
            )
        );
        let times: bool = one(
            "SELECT lease_expires_at BETWEEN now() AND clock_timestamp() + interval '30 s'
                AND high_water_mark > clock_timestamp() AND high_water_mark <= clock_timestamp() + interval '30 s'
                AND lease_holder LIKE '%:%'
               FROM snowid_status()",
        );
        assert!(times);
        let row: bool = one(
            "SELECT holder IS NOT NULL AND expires_at > clock_timestamp()
                AND high_water_ms = extract(epoch FROM (SELECT high_water_mark FROM snowid_status()) - '2026-01-01 00:00:00+00') * 1000
               FROM snowid.worker_lease WHERE worker_id = 17",
        );
        assert!(row, "the lease row matches what the worker reports");
    }

    #[pg_test]
    fn ordinary_roles_read_the_lease_table_but_cannot_write_it() {
        assert_eq!(error_of("SELECT 1"), "no error");
        Spi::run("CREATE ROLE snowid_reader; SET LOCAL ROLE snowid_reader").unwrap();
        assert_one::<i64, i64>(
            "SELECT count(*) FROM snowid.worker_lease WHERE worker_id = 17",
            1,
        );
        for statement in [
            "INSERT INTO snowid.worker_lease (worker_id) VALUES (5)",
            "UPDATE snowid.worker_lease SET high_water_ms = 0",
            "DELETE FROM snowid.worker_lease",
            "TRUNCATE snowid.worker_lease",
        ] {
            assert_eq!(
                error_of(statement),
                "42501: permission denied for table worker_lease",
                "{statement}"
            );
        }
        assert_eq!(
            error_of("SELECT snowid.lease_claim(5, 'me', 'now', 'me:1', 30000, 0, true, 1)"),
            "42501: permission denied for function lease_claim"
        );
        assert_eq!(
            error_of("SELECT snowid.lease_release(17, 'me', 'now', 0, 1)"),
            "42501: permission denied for function lease_release"
        );
        assert_eq!(
            error_of("SELECT snowid_handover(17)"),
            "42501: permission denied for function snowid_handover"
        );
    }

    /// Inserts a lease row for worker id `worker_id` held by `holder` named `name`, whose lease
    /// ends `expires_in_ms` from now and whose mark lies 30 s ahead.
    fn held_row(worker_id: i32, holder: &str, name: &str, expires_in_ms: i64) {
        as_the_lease_functions(&format!(
            "INSERT INTO snowid.worker_lease (worker_id, holder, incarnation, holder_name, renewed_at,
                 expires_at, high_water_ms, holder_role, acquired_mark_ms)
             SELECT {worker_id}, '{holder}', 'run', '{name}', clock_timestamp(),
                 clock_timestamp() + {expires_in_ms} * interval '1 millisecond', now_ms + 30000,
                 current_user, 1000
               FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 AS now_ms) n"
        ));
    }

    /// Changes the lease table with `sql` as the lease functions do, which begins no epoch (any
    /// other change does: see `snowid.lease_changed`).
    fn as_the_lease_functions(sql: &str) {
        Spi::run("SELECT set_config('snowid_lease.writing', 'on', true)").unwrap();
        Spi::run(sql).unwrap();
        Spi::run("SELECT set_config('snowid_lease.writing', 'off', true)").unwrap();
    }

    /// The registry's epoch for this test alone until its transaction ends: the tests that claim
    /// from this database as a shared registry run side by side.
    fn own_epoch() {
        Spi::run("LOCK TABLE snowid.registry_epoch IN EXCLUSIVE MODE").unwrap();
    }

    /// This database as a shared registry that has run unchanged for longer than any lease: its
    /// epoch settled (see `snowid.registry_epoch`).
    fn settled_registry() {
        own_epoch();
        Spi::run("SELECT snowid.registry_settles_at(30000, clock_timestamp(), false)").unwrap();
        Spi::run("UPDATE snowid.registry_epoch SET settles_at = began_at").unwrap();
    }

    /// `snowid.lease_claim` of `worker_id` by holder `111-new`, another server of the holder's
    /// cluster on a later timeline (a standby promoted after it, say), expired leases taken over
    /// or not: granted, and the floor less the row's mark or the holder named.
    fn claim_by_another_server(worker_id: i32, takeover_on_expiry: bool) -> String {
        one(&format!(
            "SELECT concat_ws(' ', c.granted::text, c.floor_ms - l.high_water_ms, c.holder_name)
               FROM snowid.worker_lease l,
                    snowid.lease_claim({worker_id}, '111-new', 'inc', 'pg@db2:5432', 30000,
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 + 30000,
                        {takeover_on_expiry}, 2) c
              WHERE l.worker_id = {worker_id}"
        ))
    }

    #[pg_test]
    fn a_worker_id_is_granted_to_no_other_server_while_its_holder_may_issue() {
        settled_registry();
        // Held by another server of the same cluster, its lease running for 30 s more.
        held_row(910, "111-old", "pg@db1:5432", 30_000);
        for takeover_on_expiry in [true, false] {
            assert_eq!(
                claim_by_another_server(910, takeover_on_expiry),
                "false pg@db1:5432"
            );
        }
        // Its lease ran out: a shared registry, which sees every renewal, grants the row above the
        // mark; the lease table on the server, which cannot, does not.
        held_row(911, "111-old", "pg@db1:5432", -1);
        assert_eq!(claim_by_another_server(911, false), "false pg@db1:5432");
        assert_eq!(claim_by_another_server(911, true), "true 0 pg@db2:5432");
        let holders: String = one(
            "SELECT string_agg(holder, ',' ORDER BY worker_id) FROM snowid.worker_lease WHERE worker_id IN (910, 911)",
        );
        assert_eq!(holders, "111-old,111-new");
    }

    #[pg_test]
    fn another_run_of_the_holder_waits_on_a_shared_registry_for_its_lease_to_run_out() {
        settled_registry();
        // Held by run `run` of holder 111-old, its lease running for 30 s more.
        held_row(930, "111-old", "pg@db1:5432", 30_000);
        let claim = |incarnation: &str, shared: bool| -> String {
            one(&format!(
                "SELECT concat_ws(' ', c.granted::text, c.holder_name, c.continued::text)
                   FROM snowid.lease_claim(930, '111-old', '{incarnation}', 'pg@db1:5432', 30000,
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 + 30000,
                        {shared}, 1) c"
            ))
        };
        // On a shared registry another run (a copy of the server, or an earlier run not run out)
        // is refused, and the holding run renews.
        assert_eq!(claim("clone", true), "false pg@db1:5432");
        assert_eq!(claim("run", true), "true pg@db1:5432 true");
        assert_eq!(claim("clone", true), "false pg@db1:5432");
        // On the server's own table a new run takes its row back at once.
        assert_eq!(claim("restarted", false), "true pg@db1:5432 true");
        // Its lease run out, a new run takes it on a shared registry too.
        held_row(931, "111-old", "pg@db1:5432", -1);
        assert_one::<String, &str>(
            "SELECT c.granted::text FROM snowid.lease_claim(931, '111-old', 'later', 'pg@db1:5432',
                     30000, (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000
                     + 30000, true, 1) c",
            "true",
        );
    }

    #[pg_test]
    fn a_claim_of_the_holding_run_that_knows_of_a_lower_mark_is_fenced_and_changes_nothing() {
        settled_registry();
        // Held by run `run` of 111-old, its mark a reservation made just now.
        held_row(950, "111-old", "pg@db1:5432", 30_000);
        let mark: i64 = one("SELECT high_water_ms FROM snowid.worker_lease WHERE worker_id = 950");
        let row = || -> String {
            one(
                "SELECT concat_ws(' ', high_water_ms, incarnation, expires_at, renewed_at)
                   FROM snowid.worker_lease WHERE worker_id = 950",
            )
        };
        // Claimed by run `incarnation` of 111-old, which knows of marks up to `known` ms.
        let claim = |incarnation: &str, known: i64| -> String {
            one(&format!(
                "SELECT concat_ws(' ', c.granted::text, c.fenced::text, c.renewal::text, c.holder_name)
                   FROM snowid.lease_claim(950, '111-old', '{incarnation}', 'pg@db1:5432', 30000,
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 + 30000,
                        true, 1, true, {known}) c"
            ))
        };
        // Knowing of a lower mark, the run is a copy of its memory that another copy got ahead of:
        // fenced, and the row stays as the other copy wrote it.
        let before = row();
        assert_eq!(claim("run", mark - 1), "false true pg@db1:5432");
        assert_eq!(row(), before);
        // Knowing of the mark, its own reservation whether it was answered or not: renewed.
        assert_eq!(claim("run", mark), "true false true pg@db1:5432");
        // Saying no mark, as a 0.8.0 server does through the 0.8.0 functions: renewed.
        assert_eq!(claim("run", -1), "true false true pg@db1:5432");
        assert_one::<String, &str>(
            "SELECT concat_ws(' ', c.granted::text, c.renewal::text)
               FROM snowid.lease_claim(950, '111-old', 'run', 'pg@db1:5432', 30000,
                    (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 + 30000,
                    true, 1, true) c",
            "true true",
        );
        // A grant whose reservation lies below the mark (the clocks behind it) still raises it by
        // a millisecond: the copy that knew of the mark before is fenced.
        let known: i64 = one("SELECT high_water_ms FROM snowid.worker_lease WHERE worker_id = 950");
        assert_eq!(
            one::<bool>(&format!(
                "SELECT c.granted FROM snowid.lease_claim(950, '111-old', 'run', 'pg@db1:5432', 30000,
                        0, true, 1, true, {known}) c"
            )),
            true
        );
        assert_eq!(
            one::<i64>("SELECT high_water_ms FROM snowid.worker_lease WHERE worker_id = 950"),
            known + 1
        );
        assert_eq!(claim("run", known), "false true pg@db1:5432");
        // Another run of the holder is refused as such while the lease runs, never fenced.
        assert_eq!(claim("clone", 0), "false false pg@db1:5432");
        // Its lease run out, the run that the row names is still fenced by a lower mark: it
        // would otherwise renew the grant it applied, below the other copy's ids.
        Spi::run(
            "UPDATE snowid.worker_lease SET expires_at = clock_timestamp() - interval '1 second'
                   WHERE worker_id = 950",
        )
        .unwrap();
        let before = row();
        assert_eq!(claim("run", 0), "false true pg@db1:5432");
        assert_one::<String, &str>(
            "SELECT concat_ws(' ', c.worker_id, c.granted::text, c.fenced::text)
               FROM snowid.lease_claim_any('111-old', 'run', 'pg@db1:5432', 30000, 0, 1, 950, 0) c",
            "950 false true",
        );
        assert_eq!(row(), before);
    }

    #[pg_test]
    fn a_holders_word_is_not_taken_where_the_mark_lies_above_every_mark_it_knows_of() {
        settled_registry();
        // Its row lost, then the worker id granted to 111-other, whose lease ran out.
        held_row(951, "111-other", "pg@db2:5432", -1);
        let mark: i64 = one("SELECT high_water_ms FROM snowid.worker_lease WHERE worker_id = 951");
        let row = || -> String {
            one("SELECT concat_ws(' ', holder, high_water_ms, expires_at)
                   FROM snowid.worker_lease WHERE worker_id = 951")
        };
        // 111-old claims by its word, knowing of marks up to `known` ms.
        let by_word = |known: i64| -> String {
            one(&format!(
                "SELECT concat_ws(' ', c.granted::text, c.fenced::text, c.released::text, c.holder_name)
                   FROM snowid.lease_claim(951, '111-old', 'run', 'pg@db1:5432', 30000,
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 + 30000,
                        true, 1, true, {known}) c"
            ))
        };
        // The mark shows a grant it never knew of: fenced, and the row stays as it was.
        let before = row();
        assert_eq!(by_word(mark - 1), "false true false pg@db2:5432");
        assert_eq!(row(), before);
        // Knowing of that mark, its word is taken.
        assert_eq!(by_word(mark), "true false false pg@db1:5432");
    }

    /// `snowid.lease_claim` of `worker_id` on a shared registry by `holder`'s run `run`, holding the
    /// lease by its word or not, with a time-to-live of `ttl_ms`: granted, or refused with the
    /// holder named, or with none and the seconds left until the registry settles.
    fn shared_claim(worker_id: i32, holder: &str, holding: bool, ttl_ms: i64) -> String {
        one(&format!(
            "SELECT concat_ws(' ', c.granted::text, coalesce(c.holder_name, 'nobody'),
                              CASE WHEN c.holder_name IS NULL
                                   THEN round((c.expires_at_unix_ms
                                               - extract(epoch FROM clock_timestamp()) * 1000) / 1000) END)
               FROM snowid.lease_claim({worker_id}, '{holder}', 'run', 'pg@{holder}:5432', {ttl_ms},
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 + {ttl_ms},
                        true, 1, {holding}) c"
        ))
    }

    #[pg_test]
    fn a_shared_registry_in_a_new_epoch_renews_running_leases_and_grants_nothing_else_until_it_settles(
    ) {
        own_epoch();
        // A lease that runs, one that ran out, and a worker id with no row (lost, or never used);
        // the longest lease the registry knows of lasts 45 s.
        held_row(940, "111-a", "pg@111-a:5432", 30_000);
        held_row(941, "111-b", "pg@111-b:5432", -1);
        as_the_lease_functions(
            "UPDATE snowid.worker_lease SET renewed_at = expires_at - interval '45 seconds'
              WHERE worker_id = 941",
        );
        // The epoch as CREATE EXTENSION made it, as a registry restored from a dump (which leaves
        // the epoch out) has it too.
        assert_one::<String, &str>("SELECT run FROM snowid.registry_epoch", "");
        // The holder of the running lease renews it by its row, without saying it holds it.
        assert_eq!(
            shared_claim(940, "111-a", false, 30_000),
            "true pg@111-a:5432"
        );
        // Nothing else is granted for 45 s: not the row that ran out, not a row never seen.
        assert_eq!(shared_claim(941, "111-c", false, 30_000), "false nobody 45");
        assert_eq!(shared_claim(942, "111-c", false, 30_000), "false nobody 45");
        // A claim with a longer time-to-live makes the wait as long.
        assert_eq!(shared_claim(942, "111-c", false, 60_000), "false nobody 60");
        // A server that holds the lease by its word gets its lost row back; the row of a running
        // lease stays its holder's.
        assert_eq!(
            shared_claim(942, "111-d", true, 30_000),
            "true pg@111-d:5432"
        );
        assert_eq!(
            shared_claim(940, "111-c", true, 30_000),
            "false pg@111-a:5432"
        );
        // A server that leases any worker id: refused whichever it picks, or given the one it holds.
        let claim_any = |held: i32| -> String {
            one(&format!(
                "SELECT concat_ws(' ', c.granted::text, coalesce(c.holder_name, 'nobody'),
                                  CASE WHEN c.granted THEN c.worker_id END)
                   FROM snowid.lease_claim_any('111-e', 'run', 'pg@111-e:5432', 30000,
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 + 30000,
                        1, {held}) c"
            ))
        };
        assert_eq!(claim_any(-1), "false nobody");
        assert_eq!(claim_any(943), "true pg@111-e:5432 943");
        // The server's own table is no shared registry: nothing to wait for there.
        assert_eq!(claim_by_another_server(941, false), "false pg@111-b:5432");
        // Settled, the registry grants the row that ran out, above its mark.
        Spi::run("UPDATE snowid.registry_epoch SET settles_at = began_at").unwrap();
        assert_eq!(
            shared_claim(941, "111-c", false, 30_000),
            "true pg@111-c:5432"
        );
        // A server's word that it holds a lease whose row is gone: rows were lost, a new epoch
        // begins, as long as the longest lease the registry has known.
        as_the_lease_functions("DELETE FROM snowid.worker_lease WHERE worker_id = 943");
        assert_eq!(
            shared_claim(943, "111-e", true, 30_000),
            "true pg@111-e:5432"
        );
        assert_eq!(shared_claim(944, "111-f", false, 30_000), "false nobody 60");
        // The server restarted, or its lease table rewritten: a new epoch begins too.
        Spi::run("UPDATE snowid.registry_epoch SET run = 'an earlier run', settles_at = began_at")
            .unwrap();
        assert_eq!(shared_claim(944, "111-f", false, 30_000), "false nobody 60");
        // Nor does a registry without rows settle at once: nothing tells one just created from
        // one that lost every row, dropped and created again under its fleet.
        let as_created = || {
            as_the_lease_functions("DELETE FROM snowid.worker_lease");
            Spi::run(
                "UPDATE snowid.registry_epoch
                    SET run = '', began_at = '-infinity', settles_at = '-infinity', longest_ttl_ms = 0",
            )
            .unwrap();
        };
        as_created();
        assert_eq!(shared_claim(944, "111-f", false, 9_000), "false nobody 9");
        // Only an operator can say that no server ever held a lease from it, and only before the
        // first claim (the refused claim left the row of 944).
        let refusal = "55000: the lease registry is not new: it has lease rows, or servers have claimed from it";
        assert_eq!(error_of("SELECT snowid_registry_is_new()"), refusal);
        as_created();
        held_row(945, "111-g", "pg@111-g:5432", 30_000);
        assert_eq!(error_of("SELECT snowid_registry_is_new()"), refusal);
        as_created();
        Spi::run("SELECT snowid_registry_is_new()").unwrap();
        assert_eq!(
            shared_claim(944, "111-f", false, 30_000),
            "true pg@111-f:5432"
        );
    }

    #[pg_test]
    fn a_change_of_the_lease_table_by_hand_begins_an_epoch_and_the_lease_functions_do_not() {
        settled_registry();
        held_row(960, "111-a", "pg@111-a:5432", 30_000);
        assert_eq!(
            shared_claim(961, "111-b", false, 30_000),
            "true pg@111-b:5432"
        );
        assert_eq!(
            one::<String>("SELECT snowid_handover(961)"),
            "pg@111-b:5432"
        );
        assert!(one::<bool>(
            "SELECT snowid.lease_release(960, '111-a', 'run', 0, 1)"
        ));
        assert_eq!(
            shared_claim(962, "111-b", false, 30_000),
            "true pg@111-b:5432"
        );
        let changes = [
            "DELETE FROM snowid.worker_lease WHERE worker_id = 962",
            "UPDATE snowid.worker_lease SET expires_at = clock_timestamp() WHERE worker_id = 961",
            "INSERT INTO snowid.worker_lease (worker_id) VALUES (963)",
            "TRUNCATE snowid.worker_lease",
        ];
        for (worker_id, change) in (964..).zip(changes) {
            Spi::run("UPDATE snowid.registry_epoch SET settles_at = began_at").unwrap();
            Spi::run(change).unwrap();
            assert_eq!(
                shared_claim(worker_id, "111-c", false, 9_000),
                "false nobody 30",
                "{change}"
            );
        }
    }

    /// A maintenance session with session_replication_role = replica, where the triggers that keep
    /// a subscription's rows out fire too: its changes land, and each begins an epoch.
    #[pg_test]
    fn a_change_by_hand_in_the_replica_role_lands_and_begins_an_epoch() {
        settled_registry();
        held_row(970, "111-a", "pg@111-a:5432", 30_000);
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        let changes = [
            (
                "UPDATE snowid.worker_lease SET holder_name = 'edited' WHERE worker_id = 970",
                "SELECT count(*) FROM snowid.worker_lease WHERE holder_name = 'edited'",
                1,
            ),
            (
                "INSERT INTO snowid.worker_lease (worker_id) VALUES (971)",
                "SELECT count(*) FROM snowid.worker_lease WHERE worker_id = 971",
                1,
            ),
            (
                "DELETE FROM snowid.worker_lease WHERE worker_id = 971",
                "SELECT count(*) FROM snowid.worker_lease WHERE worker_id = 971",
                0,
            ),
            (
                "TRUNCATE snowid.worker_lease",
                "SELECT count(*) FROM snowid.worker_lease",
                0,
            ),
        ];
        for (change, count, expected) in changes {
            Spi::run("UPDATE snowid.registry_epoch SET settles_at = began_at").unwrap();
            Spi::run(change).unwrap();
            assert_eq!(one::<i64>(count), expected, "{change}");
            assert!(
                one::<bool>(
                    "SELECT settles_at > clock_timestamp() + interval '29 seconds'
                       FROM snowid.registry_epoch"
                ),
                "{change}"
            );
        }
    }

    /// Who else holds `worker_id` for a standby whose holder is `111-me`, as the lease worker asks
    /// with `OTHER_HOLDER_SQL`, only running leases counting or every held row.
    fn other_holder(worker_id: i32, running_only: bool) -> Option<String> {
        Spi::connect(|client| {
            let table = client.select(
                &crate::lease::OTHER_HOLDER_SQL
                    .replace("$1", &worker_id.to_string())
                    .replace("$2", "'111-me'")
                    .replace("$3", &running_only.to_string()),
                None,
                &[],
            )?;
            table
                .into_iter()
                .map(|row| {
                    Ok(format!(
                        "{} {}",
                        row.get::<String>(1)?.unwrap(),
                        row.get::<String>(2)?.unwrap()
                    ))
                })
                .collect::<Result<Vec<_>, pgrx::spi::SpiError>>()
        })
        .unwrap()
        .pop()
    }

    #[pg_test]
    fn a_standby_sees_the_other_holders_of_its_worker_id_never_itself() {
        held_row(920, "111-me", "pg@db2:5432", 30_000);
        held_row(921, "111-old", "pg@db1:5432", 30_000);
        held_row(922, "111-old", "pg@db1:5432", -1);
        held_row(923, "111-old", "pg@db1:5432", 30_000);
        as_the_lease_functions(
            "UPDATE snowid.worker_lease SET holder_name = NULL WHERE worker_id = 923",
        );
        as_the_lease_functions("INSERT INTO snowid.worker_lease (worker_id, high_water_ms, released_by, released_timeline) VALUES (924, 1000, '111-old', 1)");
        for running_only in [true, false] {
            assert_eq!(other_holder(920, running_only), None);
            assert_eq!(
                other_holder(921, running_only).as_deref(),
                Some("pg@db1:5432 111-old")
            );
            // A holder without a name (recorded by 0.2.0) is named by its holder.
            assert_eq!(
                other_holder(923, running_only).as_deref(),
                Some("111-old 111-old")
            );
            assert_eq!(other_holder(924, running_only), None);
        }
        // A lease that ran out: nobody's on a shared registry, which asks for running leases only;
        // on the server's own table, still its holder's until released or handed over.
        assert_eq!(other_holder(922, true), None);
        assert_eq!(
            other_holder(922, false).as_deref(),
            Some("pg@db1:5432 111-old")
        );
    }

    #[pg_test]
    fn members_of_pg_write_all_data_cannot_write_the_lease_table() {
        Spi::run(
            "CREATE ROLE snowid_writer IN ROLE pg_write_all_data; SET LOCAL ROLE snowid_writer",
        )
        .unwrap();
        for statement in [
            "INSERT INTO snowid.worker_lease (worker_id) VALUES (5)",
            "UPDATE snowid.worker_lease SET high_water_ms = 0",
            "DELETE FROM snowid.worker_lease",
        ] {
            assert_eq!(
                error_of(statement),
                "42501: permission denied to change snowid.worker_lease: only the snowid lease functions and superusers may",
                "{statement}"
            );
        }
        assert_eq!(
            error_of("TRUNCATE snowid.worker_lease"),
            "42501: permission denied for table worker_lease"
        );
    }

    #[pg_test]
    fn handover_frees_a_row_and_keeps_its_mark() {
        Spi::run(
            "INSERT INTO snowid.worker_lease (worker_id, holder, incarnation, holder_name, expires_at, high_water_ms)
             VALUES (900, 'gone', 'run', 'old-primary:5432', clock_timestamp() + interval '1 hour', 28728000000)",
        )
        .unwrap();
        assert_eq!(
            Spi::get_one::<String>("SELECT snowid_handover(900)").unwrap(),
            Some("old-primary:5432".into())
        );
        assert_eq!(
            Spi::get_three::<String, i64, bool>(
                "SELECT coalesce(holder, 'free'), high_water_ms, expires_at IS NULL FROM snowid.worker_lease WHERE worker_id = 900"
            )
            .unwrap(),
            (Some("free".into()), Some(28_728_000_000), Some(true))
        );
        assert_eq!(
            Spi::get_one::<String>("SELECT snowid_handover(900)").unwrap(),
            None
        );
        assert_eq!(
            Spi::get_one::<String>("SELECT snowid_handover(901)").unwrap(),
            None
        );
        assert_eq!(
            Spi::get_one::<String>("SELECT snowid_handover(NULL)").unwrap(),
            None
        );
        for (worker_id, shown) in [("1024", "1024"), ("-1", "-1")] {
            assert_eq!(
                error_of(&format!("SELECT snowid_handover({worker_id})")),
                format!("22023: worker id must be between 0 and 1023, not {shown}")
            );
        }
    }

    #[pg_test]
    fn pg_dump_keeps_the_lease_rows() {
        assert!(one::<bool>(
            "SELECT 'snowid.worker_lease'::regclass = ANY (extconfig) FROM pg_extension WHERE extname = 'snowid'"
        ));
    }

    #[pg_test]
    fn high_water_marks_stay_within_the_layout() {
        assert_eq!(
            error_of("INSERT INTO snowid.worker_lease (worker_id, high_water_ms) VALUES (901, 2199023255553)"),
            "23514: new row for relation \"worker_lease\" violates check constraint \"worker_lease_high_water_ms_check\""
        );
    }

    // The documentation checked against this server's catalogs and snowid's own error reports, so
    // that a page cannot drift from what the server has: docs/reference.md's settings, markings,
    // status columns and refusal reasons, and docs/functions.md's errors.

    const REFERENCE: &str = include_str!("../docs/reference.md");
    const FUNCTIONS: &str = include_str!("../docs/functions.md");

    /// The part of `page` under the heading line `heading`, to the next heading of its level or
    /// above.
    fn section<'a>(page: &'a str, heading: &str) -> &'a str {
        let start = page
            .find(&format!("\n{heading}\n"))
            .unwrap_or_else(|| panic!("no heading {heading}"))
            + 1;
        let level = heading.split(' ').next().unwrap();
        let rest = &page[start + heading.len()..];
        let end = rest
            .match_indices("\n#")
            .find(|(at, _)| {
                let line = rest[at + 1..].split(' ').next().unwrap();
                line.chars().all(|c| c == '#') && line.len() <= level.len()
            })
            .map_or(rest.len(), |(at, _)| at);
        &page[start..start + heading.len() + end]
    }

    /// The rows of the first table of `text`, each a list of its cells without backticks.
    fn table_rows(text: &str) -> Vec<Vec<String>> {
        text.lines()
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'))
            .skip(2)
            .map(|line| {
                line.trim_matches('|')
                    .split(" | ")
                    .map(|cell| cell.trim().replace('`', ""))
                    .collect()
            })
            .collect()
    }

    /// The rows of `query`, each its first `columns` columns as text.
    fn texts(query: &str, columns: usize) -> Vec<Vec<String>> {
        Spi::connect(|client| {
            let table = client.select(query, None, &[])?;
            table
                .into_iter()
                .map(|row| {
                    (1..=columns)
                        .map(|column| Ok(row.get::<String>(column)?.unwrap_or_default()))
                        .collect::<Result<Vec<_>, pgrx::spi::SpiError>>()
                })
                .collect::<Result<Vec<_>, pgrx::spi::SpiError>>()
        })
        .unwrap()
    }

    #[pg_test]
    fn docs_reference_gives_every_setting_as_pg_settings_has_it() {
        // The type, default, range and context, in the words the page uses for them.
        let mut actual = texts(
            "SELECT name,
                    CASE vartype WHEN 'integer' THEN 'integer' || CASE unit WHEN 's' THEN ', seconds' WHEN 'ms' THEN ', milliseconds' ELSE '' END
                                 WHEN 'bool' THEN 'boolean' ELSE 'text' END,
                    CASE WHEN vartype = 'bool' THEN boot_val ELSE boot_val || coalesce(unit, '') END,
                    CASE WHEN vartype = 'integer' THEN min_val || ' to ' || max_val || coalesce(' ' || unit, '') ELSE '' END,
                    CASE context WHEN 'postmaster' THEN 'at a restart' WHEN 'sighup' THEN 'at a reload' ELSE context END
               FROM pg_settings WHERE name LIKE 'snowid.%'",
            5,
        );
        actual.sort();
        let settings = section(REFERENCE, "## Settings");
        let mut documented: Vec<Vec<String>> = settings
            .lines()
            .filter(|line| line.starts_with("### "))
            .map(|heading| {
                let name = heading["### ".len()..].trim_matches('`').to_string();
                let row = table_rows(section(settings, heading))
                    .pop()
                    .unwrap_or_else(|| panic!("no table under {heading}"));
                let [kind, default, range, takes_effect] = <[String; 4]>::try_from(row).unwrap();
                // The default's first word is the value ("-1 (unset)", "empty: ..."); a text's
                // range is not a number's.
                let default = match default.split([' ', ':']).next().unwrap() {
                    "empty" => String::new(),
                    value => value.to_string(),
                };
                let range = if kind.starts_with("integer") {
                    range
                } else {
                    String::new()
                };
                vec![name, kind, default, range, takes_effect]
            })
            .collect();
        documented.sort();
        assert_eq!(documented, actual);
    }

    #[pg_test]
    fn docs_reference_gives_every_function_with_its_markings() {
        let mut actual = texts(
            "SELECT format('%s(%s)', proname, oidvectortypes(proargtypes)),
                    CASE provolatile WHEN 'i' THEN 'immutable' WHEN 's' THEN 'stable' ELSE 'volatile' END,
                    CASE WHEN proisstrict THEN 'yes' ELSE 'no' END,
                    CASE proparallel WHEN 's' THEN 'safe' WHEN 'r' THEN 'restricted' ELSE 'unsafe' END,
                    CASE WHEN has_function_privilege('public', p.oid, 'EXECUTE') THEN 'every role' ELSE 'superusers' END
               FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
              WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
                AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'snowid')
                AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'snowid')",
            5,
        );
        actual.sort();
        let mut documented: Vec<Vec<String>> = table_rows(section(REFERENCE, "## Functions"))
            .into_iter()
            .map(|mut row| {
                row[4] = row[4].split(" (").next().unwrap().to_string();
                row
            })
            .collect();
        documented.sort();
        assert_eq!(documented, actual);
    }

    #[pg_test]
    fn docs_reference_gives_every_column_of_snowid_status_and_every_refusal_reason() {
        let actual = texts(
            "SELECT a.name, format_type(a.type, NULL)
               FROM pg_proc p,
                    unnest(p.proargnames, p.proallargtypes::oid[], p.proargmodes) AS a(name, type, mode)
              WHERE p.proname = 'snowid_status' AND a.mode = 't'",
            2,
        );
        let documented: Vec<Vec<String>> = table_rows(section(REFERENCE, "## `snowid_status()`"))
            .into_iter()
            .map(|row| row[..2].to_vec())
            .collect();
        assert_eq!(documented, actual);
        let reasons: Vec<String> = texts("SELECT reason FROM snowid_refusals()", 1)
            .into_iter()
            .map(|mut row| row.remove(0))
            .collect();
        let documented: Vec<String> = table_rows(section(REFERENCE, "## `snowid_refusals()`"))
            .into_iter()
            .map(|mut row| row.remove(0))
            .collect();
        assert_eq!(documented, reasons);
    }

    /// Each error that docs/functions.md's section "Errors" shows as the client sees it, a
    /// ```text block's entry (ERROR or FATAL, then DETAIL and HINT).
    fn documented_errors() -> Vec<String> {
        let mut entries = vec![];
        let mut entry = String::new();
        let mut in_block = false;
        for line in section(FUNCTIONS, "## Errors").lines() {
            match line {
                "```text" => in_block = true,
                "```" | "" if in_block => {
                    in_block = line.is_empty();
                    if !entry.is_empty() {
                        entries.push(std::mem::take(&mut entry));
                    }
                }
                line if in_block => {
                    entry.push_str(line);
                    entry.push('\n');
                }
                _ => {}
            }
        }
        entries
    }

    /// What a client is shown of `report`, raised at `level`, with psql's `VERBOSITY verbose`.
    fn as_shown(level: &str, report: &pgrx::pg_sys::panic::ErrorReport) -> String {
        let mut shown = format!("{level}:  {}: {}\n", sqlstate(report), report.message());
        if let Some(detail) = report.detail() {
            shown.push_str(&format!("DETAIL:  {detail}\n"));
        }
        if let Some(hint) = report.hint() {
            shown.push_str(&format!("HINT:  {hint}\n"));
        }
        shown
    }

    /// The SQLSTATE of `report` as a client reads it: five characters.
    fn sqlstate(report: &pgrx::pg_sys::panic::ErrorReport) -> String {
        use pgrx::PgSqlErrorCode::*;
        // A report shows its code by name; these are the ones a refusal can carry.
        let code = [
            ERRCODE_T_R_SERIALIZATION_FAILURE,
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            ERRCODE_READ_ONLY_SQL_TRANSACTION,
            ERRCODE_ADMIN_SHUTDOWN,
        ]
        .into_iter()
        .find(|code| report.to_string().starts_with(&format!("{code:?}: ")))
        .unwrap_or_else(|| panic!("a refusal raised with another SQLSTATE: {report}"));
        sqlstate_text(code)
    }

    fn sqlstate_text(code: pgrx::PgSqlErrorCode) -> String {
        // PostgreSQL packs the five characters six bits each, the first lowest.
        let packed = code as isize;
        (0..5)
            .map(|place| char::from(b'0' + ((packed >> (6 * place)) & 0x3f) as u8))
            .collect()
    }

    #[pg_test]
    fn docs_functions_gives_every_refusal_reason_its_sqlstate_and_whether_to_retry() {
        use crate::errors::refusal_sqlstate;
        use crate::refusals::Reason;
        let documented: Vec<Vec<String>> =
            table_rows(section(FUNCTIONS, "### Refusals: retry or call someone"))
                .into_iter()
                .map(|row| row[..3].to_vec())
                .collect();
        let actual: Vec<Vec<String>> = Reason::ALL
            .iter()
            .map(|&reason| {
                let retry = if reason.ends_by_itself() { "yes" } else { "no" };
                vec![
                    reason.label().to_string(),
                    sqlstate_text(refusal_sqlstate(reason)),
                    retry.to_string(),
                ]
            })
            .collect();
        assert_eq!(documented, actual);
    }

    #[pg_test]
    fn docs_functions_shows_every_refusal_and_nothing_snowid_does_not_raise() {
        use crate::errors::{Circumstances, SnowidError};
        use crate::layout::TimestampOutOfRange;
        use crate::lease::{State, Status, Text};
        use crate::refusals::{Reason, Refusal};
        // A lease status for worker id `worker_id` in `state`, as the docs' examples have it.
        let status = |state: State, worker_id: Option<u16>| Status {
            state,
            worker_id,
            ..Status::default()
        };
        let held_by = |worker_id: u16, holder: &str, expires_at: i64| Status {
            holder: Text::new(holder),
            expires_at,
            ..status(State::HeldByOther, Some(worker_id))
        };
        let until = 1_795_968_012_345; // 2026-11-29 16:00:12.345 UTC
        let circumstances = |status: Status| Circumstances {
            status,
            configured_worker_id: None,
            monotonic_ns: 26_000_000_000,
            // 652 ms before 2026-11-30 11:19:41.298 UTC, the example's reach.
            unix_ms: 1_796_037_581_298 - 652,
        };
        let examples: Vec<(SnowidError, Status)> = vec![
            (SnowidError::NotPreloaded, Status::default()),
            (SnowidError::WorkerIdUnset, Status::default()),
            (SnowidError::AnyWorkerIdWithoutRegistry, Status::default()),
            (SnowidError::Refused(Refusal::ClockBehind { by_ms: 9998 }), Status::default()),
            (SnowidError::Refused(Refusal::ClockStalled { waited_ms: 16 }), Status::default()),
            (
                SnowidError::Refused(Refusal::ClockOutOfRange(TimestampOutOfRange::BeforeEpoch)),
                Status::default(),
            ),
            (
                SnowidError::Refused(Refusal::BelowFloor { by_ms: 652 }),
                status(State::Held, Some(5)),
            ),
            (
                SnowidError::Refused(Refusal::NotLeased),
                Status {
                    last_error: Text::new(
                        "extension snowid 0.3.0 or later is not installed in database \"upgraded\"",
                    ),
                    ..status(State::Starting, Some(21))
                },
            ),
            (
                SnowidError::Refused(Refusal::NotLeased),
                Status {
                    handover_needed: true,
                    ..held_by(5, "primary@db1:5432", until)
                },
            ),
            (
                SnowidError::Refused(Refusal::NotLeased),
                Status {
                    handover_needed: true,
                    released: true,
                    ..held_by(5, "primary@db1:5432", until)
                },
            ),
            (SnowidError::Refused(Refusal::NotLeased), held_by(1, "node1@db7:5432", until)),
            (
                SnowidError::Refused(Refusal::NotLeased),
                Status {
                    own_name: true,
                    ..held_by(6, "node1@db7:5432", until)
                },
            ),
            (SnowidError::Refused(Refusal::NotLeased), status(State::HeldByOther, None)),
            (
                SnowidError::Refused(Refusal::NotLeased),
                Status {
                    unsettled: true,
                    // 2026-12-02 09:00:12.345 UTC
                    ..held_by(5, "", 1_796_202_012_345)
                },
            ),
            (
                SnowidError::Refused(Refusal::NotLeased),
                Status {
                    renewed_ns: 1_000_000_000,
                    ..status(State::Held, Some(5))
                },
            ),
            (SnowidError::Refused(Refusal::BoundReached), status(State::Held, Some(5))),
            (
                SnowidError::Refused(Refusal::BoundReached),
                Status {
                    ceiling_error: Text::new(
                        "could not record the ceiling in snowid.ceiling: No space left on device (os error 28)",
                    ),
                    ..status(State::Held, Some(5))
                },
            ),
            (
                SnowidError::Refused(Refusal::NotLeased),
                Status {
                    // 2026-11-29 16:00:15.120 UTC
                    unreachable_since: 1_795_968_015_120,
                    last_error: Text::new("connection to server at \"10.0.0.5\", port 5432 failed: Connection refused Is the server running on that host and accepting TCP/IP connections?"),
                    ..status(State::RegistryUnreachable, Some(3))
                },
            ),
            (SnowidError::Refused(Refusal::NotLeased), status(State::Released, Some(5))),
            (SnowidError::PostmasterGone, Status::default()),
            (SnowidError::InRecovery, Status::default()),
        ];
        let documented = documented_errors();
        let mut reasons = vec![];
        let mut raised = vec![];
        for (error, status) in examples {
            let level = if matches!(error, SnowidError::PostmasterGone) {
                "FATAL"
            } else {
                "ERROR"
            };
            reasons.extend(error.reason(&status));
            let shown = as_shown(
                level,
                &error.report_at("snowid_next", || circumstances(status)),
            );
            assert!(
                documented.contains(&shown),
                "docs/functions.md does not show this error as snowid raises it:\n{shown}"
            );
            raised.push(shown);
        }
        for entry in &documented {
            assert!(
                raised.contains(entry),
                "docs/functions.md shows an error that snowid does not raise so:\n{entry}"
            );
        }
        for reason in Reason::ALL {
            assert!(
                reasons.contains(&reason),
                "no example of docs/functions.md refuses for {}",
                reason.label()
            );
        }
    }
}
