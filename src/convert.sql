-- Converting an existing bigint key, filled by a sequence or an identity, to snowid_next().
CREATE FUNCTION snowid_convert_column(table_name regclass, column_name name DEFAULT 'id')
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Row-level security would hide rows from the check of the largest value.
SET row_security = off
AS $$
DECLARE
    table_kind "char";
    table_owner oid;
    is_partition boolean;
    column_number smallint;
    column_type regtype;
    identity_kind "char";
    generated_kind "char";
    owned_sequence text;
    old_default text;
    sequence_reached bigint;
    largest bigint;
    what_became text;
BEGIN
    IF table_name IS NULL OR column_name IS NULL THEN
        RAISE EXCEPTION 'snowid_convert_column needs a table and a column, not NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT relkind, relowner, relispartition INTO table_kind, table_owner, is_partition
      FROM pg_class WHERE oid = table_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation with OID % does not exist', table_name::oid USING ERRCODE = 'undefined_table';
    END IF;
    IF table_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table', table_name USING ERRCODE = 'wrong_object_type';
    END IF;
    IF is_partition THEN
        RAISE EXCEPTION '% is a partition', table_name
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Rows inserted through the partitioned table take its default: convert the partitioned table, which converts its partitions too.';
    END IF;
    IF NOT pg_has_role(current_user, table_owner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of table %', table_name USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- A snapshot older than the lock below would miss rows committed while waiting for it.
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'snowid_convert_column must run at isolation level read committed, not %',
                current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'Its check of the largest value must see the rows committed while it waits for its lock.';
    END IF;
    -- ALTER TABLE's lock, taken before the largest value is read: inserts wait until commit.
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', table_name);

    SELECT attnum, atttypid, attidentity, attgenerated
      INTO column_number, column_type, identity_kind, generated_kind
      FROM pg_attribute
     WHERE attrelid = table_name AND attname = column_name AND attnum > 0 AND NOT attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of table % does not exist', column_name, table_name
            USING ERRCODE = 'undefined_column';
    END IF;
    IF column_type <> 'bigint'::regtype THEN
        RAISE EXCEPTION 'column "%" of table % is of type %, not bigint', column_name, table_name, column_type
            USING ERRCODE = 'datatype_mismatch',
                  HINT = format('Change its type first with ALTER TABLE %s ALTER COLUMN %I TYPE bigint, which rewrites the table and its indexes.', table_name, column_name);
    END IF;
    IF generated_kind <> '' THEN
        RAISE EXCEPTION 'column "%" of table % is a generated column', column_name, table_name
            USING ERRCODE = 'wrong_object_type';
    END IF;

    SELECT pg_get_expr(adbin, adrelid) INTO old_default
      FROM pg_attrdef WHERE adrelid = table_name AND adnum = column_number;
    IF old_default = format('%s()', '@extschema@.snowid_next'::regproc) THEN
        RAISE NOTICE 'column "%" of table % already defaults to snowid_next()', column_name, table_name;
        RETURN;
    END IF;

    EXECUTE format('SELECT max(%I) FROM %s', column_name, table_name) INTO largest;
    IF largest >= @extschema@.snowid_from_timestamp(now()) THEN
        RAISE EXCEPTION 'column "%" of table % holds values up to %, not all below the first id of now()',
                column_name, table_name, largest
            USING ERRCODE = 'numeric_value_out_of_range',
                  DETAIL = 'Ids issued from now on could repeat its values or sort before them.',
                  HINT = 'Values this large are not from a sequence, or come from a clock set ahead: find out which before converting.';
    END IF;

    owned_sequence := pg_get_serial_sequence(table_name::text, column_name);
    IF owned_sequence IS NOT NULL THEN
        sequence_reached := pg_sequence_last_value(owned_sequence::regclass);
    END IF;
    IF identity_kind <> '' THEN
        -- An identity's sequence belongs to the identity and goes with it.
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', table_name, column_name);
        what_became := format('its identity was dropped, and with it sequence %s (last value %s)',
                              owned_sequence, coalesce(sequence_reached::text, 'none'));
    ELSIF owned_sequence IS NOT NULL THEN
        EXECUTE format('ALTER SEQUENCE %s OWNED BY NONE', owned_sequence);
        what_became := format('sequence %s (last value %s) is kept but no longer owned by the column; drop it once nothing else uses it',
                              owned_sequence, coalesce(sequence_reached::text, 'none'));
    ELSIF old_default IS NOT NULL THEN
        what_became := format('it no longer defaults to %s', old_default);
    ELSE
        what_became := 'it had no default';
    END IF;
    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT @extschema@.snowid_next()', table_name, column_name);
    RAISE NOTICE 'column "%" of table % now defaults to snowid_next(); %', column_name, table_name, what_became;
END
$$;
COMMENT ON FUNCTION snowid_convert_column(regclass, name) IS
    'Makes a bigint column filled by a sequence or an identity default to snowid_next(), keeping its values';
