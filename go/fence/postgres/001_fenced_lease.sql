-- fenced-lease: fencing tokens checked by PostgreSQL itself, for any client (PostgreSQL 11+).
--
-- Install (idempotent; again to upgrade), in one transaction:
--   psql --single-transaction -v ON_ERROR_STOP=1 -f fence/postgres/001_fenced_lease.sql
-- Fence a table: adds the column fence_token BIGINT NOT NULL DEFAULT 0 and a trigger.
--   SELECT fenced_lease.enable('payouts');
--
-- A write presents its token in the row's fence_token column, or for a whole transaction in
-- the setting fenced_lease.token (the only way for a DELETE):
--   UPDATE payouts SET paid_by = 'a', fence_token = 7 WHERE account = 42;
--   BEGIN; SET LOCAL fenced_lease.token = '7'; DELETE FROM payouts WHERE account = 42; COMMIT;
-- The trigger refuses any presented token lower than the row's (the highest it accepted)
-- with SQLSTATE FL001,
--   ERROR:  fenced out: token 6 is lower than 7, the highest token the resource has accepted
--   DETAIL:  presented=6 highest=7
-- and records the highest presented one. It runs under the row lock, so the check and the
-- write are one atomic step. An invalid token (negative, NULL, not an integer) is FL002.
--
-- Not checked: a statement that presents no token (an UPDATE that leaves fence_token as it
-- is, a DELETE without the setting), TRUNCATE, and the insert of a row that was deleted: a
-- deleted row takes its token with it, so keep rows a stale holder could recreate.
--
-- Tables without the trigger can call the check directly:
--   UPDATE t SET ..., fence_token = fenced_lease.accept(fence_token, 7) WHERE ...;

-- Concurrent installs wait for each other (within the transaction this file runs in).
DO $$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('fenced_lease migration')); END $$;

CREATE SCHEMA IF NOT EXISTS fenced_lease;
COMMENT ON SCHEMA fenced_lease IS 'fenced-lease: fencing tokens checked by the database (migration 001)';
GRANT USAGE ON SCHEMA fenced_lease TO PUBLIC;

-- `token` if it is not lower than `highest` (the highest accepted so far; NULL for none),
-- else raises FL001. The one comparison every check here makes.
CREATE OR REPLACE FUNCTION fenced_lease.accept(highest bigint, token bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  IF token IS NULL OR token < 0 THEN
    RAISE EXCEPTION 'invalid fencing token %: tokens are non-negative integers',
      coalesce(token::text, 'NULL') USING ERRCODE = 'FL002';
  END IF;
  IF token < highest THEN
    RAISE EXCEPTION 'fenced out: token % is lower than %, the highest token the resource has accepted',
      token, highest
      USING ERRCODE = 'FL001', DETAIL = format('presented=%s highest=%s', token, highest);
  END IF;
  RETURN token;
END
$$;

-- The token the setting fenced_lease.token presents for this transaction, NULL if unset.
CREATE OR REPLACE FUNCTION fenced_lease.session_token()
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
  setting text := nullif(current_setting('fenced_lease.token', true), '');
BEGIN
  IF setting IS NULL THEN
    RETURN NULL;
  END IF;
  IF setting ~ '^[0-9]{1,19}$' THEN
    IF setting::numeric <= 9223372036854775807 THEN
      RETURN setting::bigint;
    END IF;
  END IF;
  RAISE EXCEPTION 'invalid fencing token % in fenced_lease.token: tokens are non-negative integers',
    quote_literal(setting) USING ERRCODE = 'FL002';
END
$$;

-- BEFORE INSERT OR UPDATE OR DELETE, FOR EACH ROW, on a fenced table (fenced_lease.enable):
-- every token the statement presents must be accepted by the row; the row keeps the highest.
CREATE OR REPLACE FUNCTION fenced_lease.check_token()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  setting bigint := fenced_lease.session_token();
  highest bigint := 0; -- a new row has accepted no token
BEGIN
  IF TG_OP <> 'INSERT' THEN
    highest := OLD.fence_token;
  END IF;
  IF setting IS NOT NULL THEN
    PERFORM fenced_lease.accept(highest, setting);
  END IF;
  IF TG_OP = 'DELETE' THEN
    RETURN OLD;
  END IF;
  NEW.fence_token := greatest(fenced_lease.accept(highest, NEW.fence_token), setting);
  RETURN NEW;
END
$$;

-- Fences `tbl`: adds the column fence_token if it is missing, and the trigger.
CREATE OR REPLACE FUNCTION fenced_lease.enable(tbl regclass)
RETURNS void LANGUAGE plpgsql SET client_min_messages = warning AS $$
BEGIN
  EXECUTE format('ALTER TABLE %s ADD COLUMN IF NOT EXISTS fence_token bigint NOT NULL DEFAULT 0', tbl);
  IF (SELECT atttypid FROM pg_attribute WHERE attrelid = tbl AND attname = 'fence_token')
     <> 'bigint'::regtype THEN
    RAISE EXCEPTION '%.fence_token is not a bigint', tbl USING ERRCODE = 'datatype_mismatch';
  END IF;
  EXECUTE format('DROP TRIGGER IF EXISTS fenced_lease ON %s', tbl);
  EXECUTE format('CREATE TRIGGER fenced_lease BEFORE INSERT OR UPDATE OR DELETE ON %s '
    'FOR EACH ROW EXECUTE FUNCTION fenced_lease.check_token()', tbl);
END
$$;
