-- fenced-lease migration 002: one high-water mark per scope (PostgreSQL 11+; MERGE from 15).
--
-- Install on top of 001 (idempotent; again to upgrade), each file in one transaction:
--   psql --single-transaction -v ON_ERROR_STOP=1 -f fence/postgres/001_fenced_lease.sql
--   psql --single-transaction -v ON_ERROR_STOP=1 -f fence/postgres/002_scopes.sql
--
-- THE RULE. A scope names the resource a lease protects (by default the lease,
-- '<namespace>/<name>'; any name: 'payouts', 'account-42'). PostgreSQL keeps one mark per scope
-- (fenced_lease.scopes), the highest token a write of the scope presented. A table bound to a
-- scope is strict: every INSERT, UPDATE, DELETE, upsert, MERGE, COPY and TRUNCATE of it presents
-- a token, checked against the scope's mark and raised with it in the same transaction:
--   SELECT fenced_lease.enable('payouts', 'account-42');  -- the whole table is one scope
--   SELECT fenced_lease.enable_by_column('ledger', 'account'); -- each row's scope is a column
--   BEGIN; SET LOCAL fenced_lease.token = '8'; INSERT INTO payouts ...; COMMIT;
--   INSERT INTO payouts (account, amount, fence_token) VALUES (42, 10, 8);  -- or in the row
-- A lower token than the mark is refused, nothing written:
--   ERROR:  fenced out: token 7 is lower than 8, the highest token scope "account-42" has accepted
--   DETAIL:  scope=account-42 presented=7 highest=8             (SQLSTATE FL001)
-- A write that presents no token is refused (FL003) unless an explicit exemption names it:
--   BEGIN; SET LOCAL fenced_lease.exempt = 'backfill, ticket 123'; ...; COMMIT;
-- by a member of the role fenced_lease_exempt; each exempted statement is recorded in
-- fenced_lease.exemptions. The setting presents the token of every write of its transaction;
-- without it, an INSERT presents the token in the row's fence_token, an UPDATE by setting
-- fence_token (and a DELETE or TRUNCATE cannot). fence_token records what a row presented.
--
-- ORDER. The check holds the scope's mark row until the transaction ends: an equal token under
-- a share lock (the current holder's transactions run side by side), a higher one raises it
-- under the row's exclusive lock, which waits for the transactions that checked the old mark
-- and then makes every later lower token fail. So in commit order no write with a lower token
-- commits after one with a higher token in its scope. Under REPEATABLE READ and SERIALIZABLE a
-- transaction whose snapshot predates a raise of its mark fails at its check with 40001
-- (nothing written; retried, it is checked again on the new mark and refused if stale).
--
-- COST. Bound to one scope: one check per statement that presents the setting (COPY of many
-- rows: one check, and a test of the setting per row); rows checked one by one only when they
-- present their own token. Bound by a column: one check per row. A new holder's first write waits for the old holder's open
-- transactions: bound that wait with idle_in_transaction_session_timeout on the holders' role
-- (and lock_timeout in the new holder's session).
--
-- WHO CAN STILL BYPASS IT: the table's owner and superusers (DISABLE TRIGGER, DROP TRIGGER,
-- fenced_lease.disable) and anyone they let; so holders connect as a role that only has
-- DML on the table. The triggers are ENABLE ALWAYS, so session_replication_role = replica
-- (superuser only) does not skip them; on a logical-replication subscriber, enable them
-- ENABLE TRIGGER there (origin only) or do not bind the copy. Any client may present a high
-- token and so raise a mark (a scope spoiled, fail closed: reset it, fenced_lease.reset).
--
-- REFUSALS, RECORDED. The transaction of a refused write is rolled back, and with it anything it
-- wrote, so the fence records each FL001 refusal in sequences, whose nextval and setval are
-- never rolled back: the count of refusals and the last one's scope, tokens and time. Read them
-- (any role) with
--   SELECT * FROM fenced_lease.refusals;
--   -- refused | last_at | last_scope | last_token | last_highest
-- Concurrent refusals may mix the last one's fields; the server log has every refusal whole
-- (the ERROR and its DETAIL, with log_min_error_statement's statement). Cost: nothing on the
-- writes that pass; a refusal, one nextval and four setval (each setval writes WAL: a stale
-- holder refused in a loop writes about 400 bytes of WAL per refusal).
--
-- Errors: FL001 fenced out, FL002 invalid token, FL003 no token presented, FL004 unknown
-- scope, FL005 invalid scope, FL006 exemption or reset refused, FL007 bad binding.

SET LOCAL client_min_messages = warning;
DO $$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('fenced_lease migration')); END $$;

DO $$ BEGIN
  IF to_regprocedure('fenced_lease.accept(bigint,bigint)') IS NULL THEN
    RAISE EXCEPTION 'fenced_lease migration 002 needs 001: run fence/postgres/001_fenced_lease.sql first';
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fenced_lease_exempt') THEN
    CREATE ROLE fenced_lease_exempt NOLOGIN;
  END IF;
END $$;
COMMENT ON ROLE fenced_lease_exempt IS 'fenced-lease: its members may write a fenced table without a token, with SET LOCAL fenced_lease.exempt = ''<reason>'' (recorded in fenced_lease.exemptions), and reset a scope''s mark';
COMMENT ON SCHEMA fenced_lease IS 'fenced-lease: fencing tokens checked by the database (migrations 001, 002)';

CREATE TABLE IF NOT EXISTS fenced_lease.scopes (
  scope text PRIMARY KEY CHECK (scope <> '' AND length(scope) <= 512),
  highest bigint NOT NULL CHECK (highest >= 0),
  raised_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE fenced_lease.scopes IS 'fenced-lease: the mark of each scope, the highest token its writes presented; written only by the fence''s functions';
REVOKE ALL ON fenced_lease.scopes FROM PUBLIC;
GRANT SELECT ON fenced_lease.scopes TO PUBLIC;

CREATE TABLE IF NOT EXISTS fenced_lease.exemptions (
  id bigserial PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT now(),
  session_role name NOT NULL DEFAULT session_user,
  role name NOT NULL,
  tbl text NOT NULL,
  scope text,
  statement text NOT NULL,
  reason text NOT NULL
);
COMMENT ON TABLE fenced_lease.exemptions IS 'fenced-lease: every statement that wrote a fenced table without a token, under fenced_lease.exempt';
REVOKE ALL ON fenced_lease.exemptions FROM PUBLIC;
GRANT SELECT ON fenced_lease.exemptions TO PUBLIC;

CREATE TABLE IF NOT EXISTS fenced_lease.resets (
  id bigserial PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT now(),
  session_role name NOT NULL DEFAULT session_user,
  role name NOT NULL,
  scope text NOT NULL,
  from_highest bigint,
  to_highest bigint NOT NULL,
  reason text NOT NULL
);
COMMENT ON TABLE fenced_lease.resets IS 'fenced-lease: every deliberate change of a scope''s mark (fenced_lease.reset)';
REVOKE ALL ON fenced_lease.resets FROM PUBLIC;
GRANT SELECT ON fenced_lease.resets TO PUBLIC;

-- The refusals (REFUSALS, above): written only by fenced_out, read through fenced_lease.refusals.
CREATE SEQUENCE IF NOT EXISTS fenced_lease.refused;
CREATE SEQUENCE IF NOT EXISTS fenced_lease.refused_scope MINVALUE -2147483648; -- hashtext(scope)
CREATE SEQUENCE IF NOT EXISTS fenced_lease.refused_token MINVALUE 0;
CREATE SEQUENCE IF NOT EXISTS fenced_lease.refused_highest MINVALUE 0;
CREATE SEQUENCE IF NOT EXISTS fenced_lease.refused_at MINVALUE 0; -- Unix ms
REVOKE ALL ON SEQUENCE fenced_lease.refused, fenced_lease.refused_scope, fenced_lease.refused_token,
  fenced_lease.refused_highest, fenced_lease.refused_at FROM PUBLIC;
GRANT SELECT ON SEQUENCE fenced_lease.refused, fenced_lease.refused_scope, fenced_lease.refused_token,
  fenced_lease.refused_highest, fenced_lease.refused_at TO PUBLIC;

-- `scope` if it is a scope name (1 to 512 characters), else FL005.
CREATE OR REPLACE FUNCTION fenced_lease.valid_scope(scope text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF scope IS NULL OR scope = '' OR length(scope) > 512 THEN
    RAISE EXCEPTION 'invalid scope %: a scope is a name of 1 to 512 characters',
      coalesce(quote_literal(left(scope, 40) || CASE WHEN length(scope) > 40 THEN '...' ELSE '' END), 'NULL')
      USING ERRCODE = 'FL005';
  END IF;
  RETURN scope;
END
$$;

-- The refusal of a token lower than a scope's mark, recorded first (REFUSALS, above).
CREATE OR REPLACE FUNCTION fenced_lease.fenced_out(scope text, token bigint, highest bigint)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM nextval('fenced_lease.refused'), setval('fenced_lease.refused_scope', hashtext(scope)),
    setval('fenced_lease.refused_token', token), setval('fenced_lease.refused_highest', highest),
    setval('fenced_lease.refused_at', (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
  RAISE EXCEPTION 'fenced out: token % is lower than %, the highest token scope % has accepted',
    token, highest, quote_ident(scope)
    USING ERRCODE = 'FL001',
      DETAIL = format('scope=%s presented=%s highest=%s', scope, token, highest),
      HINT = 'a newer holder of the lease wrote this scope: stop, do not retry; if no holder has such a token (a database restored, a lease re-created with its records lost), see fenced_lease.reset';
END
$$;
-- Only check (the fence's owner) records a refusal.
REVOKE ALL ON FUNCTION fenced_lease.fenced_out(text, bigint, bigint) FROM PUBLIC;

-- Checks `token` against `scope`'s mark (creating it at 0) and holds the mark until the
-- transaction ends: shared when the token equals the mark, raising it alone when it is
-- higher; refuses a lower one (FL001). Returns the token.
--
-- The locks: a raise takes the scope's advisory lock exclusively (pg_advisory_xact_lock(
-- 1718511460, hashtext(scope)): it waits for every READ COMMITTED transaction that checked the
-- old mark) and updates the mark row (which waits for the REPEATABLE READ and SERIALIZABLE ones,
-- which share the row itself: their snapshot must see the mark they compare, or fail with
-- 40001). A READ COMMITTED check shares the advisory lock, then reads the mark afresh: no write
-- to the row, so the holder's transactions do not contend on it.
CREATE OR REPLACE FUNCTION fenced_lease.check(scope text, token bigint)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  seen bigint;
  lock_key int := hashtext($1);
  read_committed boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
  IF token IS NULL OR token < 0 THEN
    RAISE EXCEPTION 'invalid fencing token %: tokens are non-negative integers',
      coalesce(token::text, 'NULL') USING ERRCODE = 'FL002';
  END IF;
  IF scope IS NULL OR scope = '' OR length(scope) > 512 THEN
    PERFORM fenced_lease.valid_scope(scope);
  END IF;
  -- Read without a lock first: taking the shared lock and then the exclusive one would
  -- deadlock two transactions that both raise.
  SELECT s.highest INTO seen FROM fenced_lease.scopes s WHERE s.scope = $1;
  IF NOT FOUND THEN
    INSERT INTO fenced_lease.scopes AS s (scope, highest) VALUES ($1, 0)
      ON CONFLICT DO NOTHING;
    seen := 0;
  END IF;
  LOOP
    IF token > seen THEN
      PERFORM pg_advisory_xact_lock(1718511460, lock_key);
      UPDATE fenced_lease.scopes s SET highest = token, raised_at = now()
        WHERE s.scope = $1 AND s.highest < token;
      IF FOUND THEN
        RETURN token;
      END IF;
    END IF;
    IF read_committed THEN
      PERFORM pg_advisory_xact_lock_shared(1718511460, lock_key);
      SELECT s.highest INTO seen FROM fenced_lease.scopes s WHERE s.scope = $1;
    ELSE
      SELECT s.highest INTO seen FROM fenced_lease.scopes s WHERE s.scope = $1 FOR SHARE;
    END IF;
    IF token < seen THEN
      PERFORM fenced_lease.fenced_out(scope, token, seen);
    END IF;
    IF token = seen THEN
      RETURN token;
    END IF;
    -- Lowered meanwhile (fenced_lease.reset): raise it.
  END LOOP;
END
$$;

-- Whether this statement writes under the exemption: fenced_lease.exempt is set (else false)
-- by a member of fenced_lease_exempt (else FL006); records it in fenced_lease.exemptions.
CREATE OR REPLACE FUNCTION fenced_lease.exempted(tbl regclass, scope text, statement text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  reason text := nullif(current_setting('fenced_lease.exempt', true), '');
BEGIN
  IF reason IS NULL THEN
    RETURN false;
  END IF;
  IF NOT pg_has_role(current_user, 'fenced_lease_exempt', 'MEMBER') THEN
    RAISE EXCEPTION 'fenced_lease.exempt is set, but role % is not a member of fenced_lease_exempt', current_user
      USING ERRCODE = 'FL006',
        HINT = 'GRANT fenced_lease_exempt TO the role that does maintenance; holders present a token instead';
  END IF;
  PERFORM fenced_lease.record_exemption(current_user, tbl::text, scope, statement, reason);
  RETURN true;
END
$$;

-- Records an exemption (executable by the members of fenced_lease_exempt only).
CREATE OR REPLACE FUNCTION fenced_lease.record_exemption(role name, tbl text, scope text, statement text, reason text)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  INSERT INTO fenced_lease.exemptions (role, tbl, scope, statement, reason)
    VALUES (role, tbl, scope, statement, reason)
$$;
REVOKE ALL ON FUNCTION fenced_lease.record_exemption(name, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lease.record_exemption(name, text, text, text, text) TO fenced_lease_exempt;

-- The refusal of a write that presents no token.
CREATE OR REPLACE FUNCTION fenced_lease.no_token(tbl regclass, scope text, statement text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% on % presents no fencing token, and % is fenced (scope %)',
    statement, tbl, tbl, coalesce(quote_ident(scope), 'of each row')
    USING ERRCODE = 'FL003',
      DETAIL = format('scope=%s', coalesce(scope, '')),
      HINT = 'present the lease''s token: SET LOCAL fenced_lease.token = ''<token>'' in the transaction (or fence_token in an inserted row); maintenance without a token: SET LOCAL fenced_lease.exempt = ''<reason>'' as a member of fenced_lease_exempt';
END
$$;

-- FOR EACH STATEMENT, BEFORE INSERT, UPDATE, DELETE, TRUNCATE (TG_ARGV[0]: the scope, or ''
-- when TG_ARGV[1] names the scope column): validates the setting, takes the exemption,
-- and checks the setting's token once for the whole statement.
CREATE OR REPLACE FUNCTION fenced_lease.check_statement()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  scope text := nullif(TG_ARGV[0], '');
  token bigint := fenced_lease.session_token(); -- 001's: FL002 on a malformed setting
BEGIN
  IF fenced_lease.exempted(TG_RELID::regclass, scope, TG_OP) THEN
    RETURN NULL;
  END IF;
  IF scope IS NULL THEN -- each row's scope: the rows are checked
    IF TG_OP = 'TRUNCATE' THEN
      RAISE EXCEPTION 'TRUNCATE of % is refused: its rows belong to many scopes', TG_RELID::regclass
        USING ERRCODE = 'FL003',
          HINT = 'DELETE a scope''s rows with its token, or TRUNCATE under fenced_lease.exempt';
    END IF;
    RETURN NULL;
  END IF;
  IF token IS NOT NULL THEN
    PERFORM fenced_lease.check(scope, token);
  ELSIF TG_OP = 'TRUNCATE' THEN
    PERFORM fenced_lease.no_token(TG_RELID::regclass, scope, TG_OP);
  END IF;
  RETURN NULL;
END
$$;

-- FOR EACH ROW, BEFORE UPDATE OF fence_token, first of the row triggers: the statement sets
-- fence_token, so the row presents it; it is passed on to check_row as -1 - token (a token is
-- never negative, so check_row cannot mistake it for the row's old one).
CREATE OR REPLACE FUNCTION fenced_lease.presented()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.fence_token IS NULL OR NEW.fence_token < 0 THEN
    RAISE EXCEPTION 'invalid fencing token %: tokens are non-negative integers',
      coalesce(NEW.fence_token::text, 'NULL') USING ERRCODE = 'FL002';
  END IF;
  NEW.fence_token := -1 - NEW.fence_token;
  RETURN NEW;
END
$$;

-- FOR EACH ROW, AFTER INSERT, BEFORE UPDATE, BEFORE DELETE (TG_ARGV as check_statement's),
-- fired only when the row must be checked (see each trigger's WHEN): a row that presents its
-- own token, a row of a table bound by column, a write with no token in the setting. (AFTER
-- INSERT, what it returns is ignored: the row keeps the fence_token it was inserted with.)
CREATE OR REPLACE FUNCTION fenced_lease.check_row()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  by_column boolean := TG_ARGV[0] = '';
  scope text := nullif(TG_ARGV[0], '');
  setting bigint := nullif(current_setting('fenced_lease.token', true), '')::bigint;
  presented bigint;
  token bigint;
  old_scope text;
BEGIN
  IF TG_OP = 'INSERT' THEN
    presented := NEW.fence_token;
  ELSIF TG_OP = 'UPDATE' AND NEW.fence_token < 0 THEN
    presented := -1 - NEW.fence_token;
    NEW.fence_token := presented;
  END IF;
  IF coalesce(current_setting('fenced_lease.exempt', true), '') <> '' THEN -- taken by the statement trigger
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
  END IF;
  IF by_column THEN
    IF TG_OP <> 'INSERT' THEN
      old_scope := to_jsonb(OLD) ->> TG_ARGV[1];
    END IF;
    IF TG_OP <> 'DELETE' THEN
      scope := to_jsonb(NEW) ->> TG_ARGV[1];
    END IF;
  END IF;
  -- The transaction's token when it presents one, else the row's.
  token := coalesce(setting, presented);
  IF token IS NULL THEN
    PERFORM fenced_lease.no_token(TG_RELID::regclass, coalesce(scope, old_scope), TG_OP);
  END IF;
  IF old_scope IS NOT NULL AND old_scope IS DISTINCT FROM scope THEN
    PERFORM fenced_lease.check(old_scope, token);
  END IF;
  IF TG_OP = 'DELETE' THEN
    RETURN OLD;
  END IF;
  IF by_column OR setting IS NULL THEN -- else the statement trigger checked the setting's
    PERFORM fenced_lease.check(scope, token);
  END IF;
  RETURN NEW;
END
$$;

-- The scope (or 'column:<name>') a table is bound to, from its triggers; NULL if none.
CREATE OR REPLACE FUNCTION fenced_lease.binding(tbl regclass)
RETURNS text LANGUAGE sql STABLE AS $$
  -- tgargs: each argument NUL-terminated; 'scope\0', or '\0column\0'.
  SELECT CASE WHEN t.tgnargs = 1 THEN convert_from(substring(t.tgargs FROM 1 FOR length(t.tgargs) - 1), 'UTF8')
              ELSE 'column:' || convert_from(substring(t.tgargs FROM 2 FOR length(t.tgargs) - 2), 'UTF8') END
    FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgname = 'fenced_lease_1_statement'
$$;

-- Every table bound to a scope, and its binding.
CREATE OR REPLACE VIEW fenced_lease.bindings AS
  SELECT t.tgrelid::regclass AS tbl,
         CASE WHEN t.tgnargs = 1 THEN fenced_lease.binding(t.tgrelid) END AS scope,
         CASE WHEN t.tgnargs = 2 THEN substring(fenced_lease.binding(t.tgrelid) FROM 8) END AS scope_column
    FROM pg_trigger t WHERE t.tgname = 'fenced_lease_1_statement';
COMMENT ON VIEW fenced_lease.bindings IS 'fenced-lease: the tables bound to a scope (scope) or to the scope of each row (scope_column)';
GRANT SELECT ON fenced_lease.bindings TO PUBLIC;

-- How many writes the fence refused (FL001), and the last one (REFUSALS, above). last_scope is
-- found among the marks by its hash (a scan of fenced_lease.scopes).
CREATE OR REPLACE VIEW fenced_lease.refusals AS
  SELECT coalesce(pg_sequence_last_value('fenced_lease.refused'), 0) AS refused,
         to_timestamp(pg_sequence_last_value('fenced_lease.refused_at') / 1000.0) AS last_at,
         (SELECT min(s.scope) FROM fenced_lease.scopes s
           WHERE hashtext(s.scope) = pg_sequence_last_value('fenced_lease.refused_scope')) AS last_scope,
         pg_sequence_last_value('fenced_lease.refused_token') AS last_token,
         pg_sequence_last_value('fenced_lease.refused_highest') AS last_highest;
COMMENT ON VIEW fenced_lease.refusals IS 'fenced-lease: the writes the fence refused (FL001), counted where a rollback cannot erase them, and the last one';
GRANT SELECT ON fenced_lease.refusals TO PUBLIC;

-- Drops the triggers a binding put on `tbl` (bind before it binds anew, and disable).
CREATE OR REPLACE FUNCTION fenced_lease.drop_triggers(tbl regclass)
RETURNS void LANGUAGE plpgsql SET client_min_messages = warning AS $$
BEGIN
  EXECUTE format('DROP TRIGGER IF EXISTS fenced_lease_1_statement ON %1$s; '
    'DROP TRIGGER IF EXISTS fenced_lease_1_truncate ON %1$s; '
    'DROP TRIGGER IF EXISTS fenced_lease_2_presented ON %1$s; '
    'DROP TRIGGER IF EXISTS fenced_lease_3_insert ON %1$s; '
    'DROP TRIGGER IF EXISTS fenced_lease_3_update ON %1$s; '
    'DROP TRIGGER IF EXISTS fenced_lease_3_delete ON %1$s; ', tbl);
END
$$;

-- Binds `tbl` (triggers, fence_token column, initial marks); `args`: the triggers' arguments.
CREATE OR REPLACE FUNCTION fenced_lease.bind(tbl regclass, want text, args text)
RETURNS void LANGUAGE plpgsql SET client_min_messages = warning AS $$
DECLARE
  bound text := fenced_lease.binding(tbl);
  typ regtype;
BEGIN
  IF bound IS NOT NULL AND bound <> want THEN
    RAISE EXCEPTION 'table % is bound to %, not %', tbl, bound, want
      USING ERRCODE = 'FL007', HINT = format('to bind it anew: SELECT fenced_lease.disable(%L) first', tbl::text);
  END IF;
  SELECT atttypid INTO typ FROM pg_attribute WHERE attrelid = tbl AND attname = 'fence_token' AND NOT attisdropped;
  IF typ IS NULL THEN
    EXECUTE format('ALTER TABLE %s ADD COLUMN fence_token bigint', tbl);
  ELSIF typ <> 'bigint'::regtype THEN
    RAISE EXCEPTION '%.fence_token is a %, not a bigint', tbl, typ USING ERRCODE = 'FL007';
  END IF;
  -- 001's row trigger, if the table had it: its marks become the scopes' (below).
  EXECUTE format('DROP TRIGGER IF EXISTS fenced_lease ON %s', tbl);
  -- No default: a row that presents no token is told from one that does (001's was 0).
  EXECUTE format('ALTER TABLE %s ALTER COLUMN fence_token DROP NOT NULL, '
    'ALTER COLUMN fence_token DROP DEFAULT', tbl);
  PERFORM fenced_lease.drop_triggers(tbl);
  -- The statement's check, when it presents a token or asks for the exemption (a statement
  -- that does neither is refused row by row, below); a TRUNCATE, always.
  EXECUTE format('CREATE TRIGGER fenced_lease_1_statement BEFORE INSERT OR UPDATE OR DELETE ON %1$s '
    'FOR EACH STATEMENT WHEN (coalesce(current_setting(''fenced_lease.token'', true), '''') <> '''' '
    'OR coalesce(current_setting(''fenced_lease.exempt'', true), '''') <> '''') '
    'EXECUTE FUNCTION fenced_lease.check_statement(%2$s)', tbl, args);
  EXECUTE format('CREATE TRIGGER fenced_lease_1_truncate BEFORE TRUNCATE ON %1$s '
    'FOR EACH STATEMENT EXECUTE FUNCTION fenced_lease.check_statement(%2$s)', tbl, args);
  EXECUTE format('CREATE TRIGGER fenced_lease_2_presented BEFORE UPDATE OF fence_token ON %1$s '
    'FOR EACH ROW EXECUTE FUNCTION fenced_lease.presented()', tbl);
  -- Row checks only where the statement's check does not cover the row (bound to one scope:
  -- the setting presented), so that a COPY of many rows costs one check; the WHEN clauses are
  -- plain expressions, evaluated per row without a function call.
  -- Inserts are checked AFTER the row (a BEFORE ROW trigger would keep COPY from inserting
  -- in batches); the statement fails, nothing written, as it would BEFORE.
  EXECUTE format('CREATE TRIGGER fenced_lease_3_insert AFTER INSERT ON %1$s FOR EACH ROW %3$s '
    'EXECUTE FUNCTION fenced_lease.check_row(%2$s)', tbl, args,
    CASE WHEN want LIKE 'column:%' THEN ''
    ELSE 'WHEN (coalesce(current_setting(''fenced_lease.token'', true), '''') = '''')' END);
  EXECUTE format('CREATE TRIGGER fenced_lease_3_update BEFORE UPDATE ON %1$s FOR EACH ROW %3$s '
    'EXECUTE FUNCTION fenced_lease.check_row(%2$s)', tbl, args,
    CASE WHEN want LIKE 'column:%' THEN ''
    ELSE 'WHEN (NEW.fence_token < 0 OR coalesce(current_setting(''fenced_lease.token'', true), '''') = '''')' END);
  EXECUTE format('CREATE TRIGGER fenced_lease_3_delete BEFORE DELETE ON %1$s FOR EACH ROW %3$s '
    'EXECUTE FUNCTION fenced_lease.check_row(%2$s)', tbl, args,
    CASE WHEN want LIKE 'column:%' THEN ''
    ELSE 'WHEN (coalesce(current_setting(''fenced_lease.token'', true), '''') = '''')' END);
  EXECUTE format('ALTER TABLE %1$s ENABLE ALWAYS TRIGGER fenced_lease_1_statement, '
    'ENABLE ALWAYS TRIGGER fenced_lease_1_truncate, '
    'ENABLE ALWAYS TRIGGER fenced_lease_2_presented, ENABLE ALWAYS TRIGGER fenced_lease_3_insert, '
    'ENABLE ALWAYS TRIGGER fenced_lease_3_update, ENABLE ALWAYS TRIGGER fenced_lease_3_delete', tbl);
END
$$;

-- Raises `scope`'s mark to `token` if it is lower (creating it), never lowers it.
CREATE OR REPLACE FUNCTION fenced_lease.raise_to(scope text, token bigint)
RETURNS void LANGUAGE sql AS $$
  SELECT fenced_lease.check(scope, greatest(coalesce(token, 0),
    (SELECT s.highest FROM fenced_lease.scopes s WHERE s.scope = raise_to.scope)))
$$;

-- Binds `tbl` to one scope: every write of it presents a token checked against that scope's
-- mark. Starts the mark at the highest fence_token of the table's rows (a table of 001
-- moves so). Idempotent; FL007 if the table is bound otherwise.
CREATE OR REPLACE FUNCTION fenced_lease.enable(tbl regclass, scope text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  highest bigint;
BEGIN
  PERFORM fenced_lease.valid_scope(scope);
  PERFORM fenced_lease.bind(tbl, scope, quote_literal(scope));
  EXECUTE format('SELECT max(fence_token) FROM %s', tbl) INTO highest;
  PERFORM fenced_lease.raise_to(scope, highest);
END
$$;

-- Binds `tbl` by its column `scope_column`: each row's write presents a token checked
-- against the mark of the scope the row names (a row that moves scope: both). Starts each
-- scope's mark at the highest fence_token of its rows. Idempotent; FL007 if bound otherwise.
CREATE OR REPLACE FUNCTION fenced_lease.enable_by_column(tbl regclass, scope_column name)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  r record;
BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = tbl AND attname = scope_column
                 AND attnum > 0 AND NOT attisdropped) THEN
    RAISE EXCEPTION 'table % has no column %', tbl, quote_ident(scope_column) USING ERRCODE = 'FL007';
  END IF;
  IF scope_column = 'fence_token' THEN
    RAISE EXCEPTION 'fence_token cannot name the scope' USING ERRCODE = 'FL007';
  END IF;
  PERFORM fenced_lease.bind(tbl, 'column:' || scope_column, format('%L, %L', '', scope_column));
  FOR r IN EXECUTE format('SELECT %1$I::text AS scope, max(fence_token) AS highest FROM %2$s '
                          'WHERE %1$I IS NOT NULL GROUP BY 1', scope_column, tbl) LOOP
    PERFORM fenced_lease.raise_to(r.scope, r.highest);
  END LOOP;
END
$$;

-- Unbinds `tbl` (its owner only: dropping its triggers needs that). Its writes are no longer
-- fenced; the marks stay.
CREATE OR REPLACE FUNCTION fenced_lease.disable(tbl regclass)
RETURNS void LANGUAGE plpgsql SET client_min_messages = warning AS $$
BEGIN
  PERFORM fenced_lease.drop_triggers(tbl);
  RAISE WARNING 'fenced_lease: % is no longer fenced', tbl;
END
$$;

-- The mark of `scope`: the highest token its writes presented. FL004 for a scope no write
-- and no binding has named.
CREATE OR REPLACE FUNCTION fenced_lease.highest(scope text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
  seen bigint;
BEGIN
  PERFORM fenced_lease.valid_scope(scope);
  SELECT s.highest INTO seen FROM fenced_lease.scopes s WHERE s.scope = highest.scope;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'unknown scope %: no write and no binding has named it', quote_literal(scope)
      USING ERRCODE = 'FL004';
  END IF;
  RETURN seen;
END
$$;

-- Sets `scope`'s mark to `highest`, lower or higher, deliberately: after a restore from a
-- backup, or when a lease was re-created with its token records lost and issues tokens below
-- the mark (every write of the scope then refused). A member of fenced_lease_exempt only;
-- recorded in fenced_lease.resets and the server log. Waits for the scope's open transactions.
-- Returns the mark it replaced (NULL: none).
CREATE OR REPLACE FUNCTION fenced_lease.reset(scope text, highest bigint, reason text)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  PERFORM fenced_lease.valid_scope(scope);
  IF highest IS NULL OR highest < 0 THEN
    RAISE EXCEPTION 'invalid fencing token %: tokens are non-negative integers',
      coalesce(highest::text, 'NULL') USING ERRCODE = 'FL002';
  END IF;
  IF coalesce(reason, '') = '' THEN
    RAISE EXCEPTION 'a reset of scope % needs a reason', quote_ident(scope) USING ERRCODE = 'FL006';
  END IF;
  IF NOT pg_has_role(current_user, 'fenced_lease_exempt', 'MEMBER') THEN
    RAISE EXCEPTION 'role % may not reset a scope''s mark: it is not a member of fenced_lease_exempt', current_user
      USING ERRCODE = 'FL006';
  END IF;
  RETURN fenced_lease.set_mark(scope, highest, reason, current_user);
END
$$;

-- reset's write (executable by the members of fenced_lease_exempt only).
CREATE OR REPLACE FUNCTION fenced_lease.set_mark(scope text, highest bigint, reason text, role name)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  was bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(1718511460, hashtext($1)); -- alone, as a raise (check)
  SELECT s.highest INTO was FROM fenced_lease.scopes s WHERE s.scope = $1 FOR UPDATE;
  INSERT INTO fenced_lease.scopes AS s (scope, highest) VALUES ($1, $2)
    ON CONFLICT ON CONSTRAINT scopes_pkey DO UPDATE SET highest = EXCLUDED.highest, raised_at = now();
  INSERT INTO fenced_lease.resets (role, scope, from_highest, to_highest, reason)
    VALUES ($4, $1, was, $2, $3);
  RAISE LOG 'fenced_lease: scope % reset from % to % by % (%)', $1, coalesce(was::text, 'none'), $2, $4, $3;
  RETURN was;
END
$$;
REVOKE ALL ON FUNCTION fenced_lease.set_mark(text, bigint, text, name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lease.set_mark(text, bigint, text, name) TO fenced_lease_exempt;

COMMENT ON FUNCTION fenced_lease.check(text, bigint) IS 'fenced-lease: checks a token against a scope''s mark and raises it, holding it to the end of the transaction; FL001 if lower';
COMMENT ON FUNCTION fenced_lease.enable(regclass, text) IS 'fenced-lease: binds a table to one scope; every write of it then presents a token (fenced_lease.token or fence_token)';
COMMENT ON FUNCTION fenced_lease.enable_by_column(regclass, name) IS 'fenced-lease: binds a table by a column naming each row''s scope';
COMMENT ON FUNCTION fenced_lease.disable(regclass) IS 'fenced-lease: unbinds a table (its owner only)';
COMMENT ON FUNCTION fenced_lease.highest(text) IS 'fenced-lease: a scope''s mark, the highest token its writes presented';
COMMENT ON FUNCTION fenced_lease.reset(text, bigint, text) IS 'fenced-lease: sets a scope''s mark deliberately (members of fenced_lease_exempt), recorded in fenced_lease.resets';
