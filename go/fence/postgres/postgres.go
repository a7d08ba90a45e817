// Package postgres fences PostgreSQL through pgx: the check is SQL shipped in this
// repository (fence/postgres/, embedded here as Migrations), so every client gets it whatever
// its language. A refusal has SQLSTATE FL001 and becomes *fence.Fenced.
//
// A Scope is the resource a lease protects: a table bound to it refuses every write (insert,
// update, delete, upsert, MERGE, COPY, TRUNCATE) presenting a token lower than the scope's
// mark, and every write presenting none (fence.ErrNoToken). A transaction presents its token
// once (Scope.Begin: SET LOCAL fenced_lease.token):
//
//	scope := postgres.ScopeOfLease("shop", "payouts")
//	err := scope.Enable(ctx, pool, "payouts") // installs the migrations if missing
//	tx, err := scope.Begin(ctx, pool, token)
//	_, err = tx.Exec(ctx, "INSERT INTO payouts (account, amount) VALUES (42, 100)")
//	err = postgres.Check(tx.Commit(ctx))
//	if errors.Is(err, fence.ErrFenced) { /* a newer holder exists: stop */ }
//
// A Table keeps a mark per row (migration 001): it fences only the rows the holder already
// wrote, and stays for the tables that use it.
package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Migration is fence/postgres/001_fenced_lease.sql: the schema fenced_lease, its check
// fenced_lease.accept(highest, token) and the trigger fenced_lease.enable(table) installs.
//
//go:embed 001_fenced_lease.sql
var Migration string

// MigrationScopes is fence/postgres/002_scopes.sql: one mark per scope, tables bound to a
// scope or by a column.
//
//go:embed 002_scopes.sql
var MigrationScopes string

// Migrations are the SQL that fences tables, in order; each is idempotent and Install runs
// each as one transaction.
var Migrations = []string{Migration, MigrationScopes}

const (
	// FenceColumn holds the highest token accepted for a row.
	FenceColumn = "fence_token"
	// FencedSQLState is the SQLSTATE of a refused token; its DETAIL reads
	// scope=<scope> presented=<token> highest=<token> (without the scope for a row of 001).
	FencedSQLState = "FL001"
	// NoTokenSQLState is the SQLSTATE of a write to a bound table that presented no token.
	NoTokenSQLState = "FL003"
)

// ErrNoRow says the row a fenced write names does not exist.
var ErrNoRow = errors.New("no such row")

// DB is what the guards need: *pgx.Conn, *pgxpool.Pool and pgx.Tx all are.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions: *pgx.Conn and *pgxpool.Pool are.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Install installs (or upgrades) the schema fenced_lease: each of Migrations as one implicit
// transaction (a multi-statement query). Needs the privileges to create a schema and a role.
func Install(ctx context.Context, db DB) error {
	for _, migration := range Migrations {
		if _, err := db.Exec(ctx, migration); err != nil {
			return Check(err)
		}
	}
	return nil
}

// installIfMissing installs Migrations unless the newest is there.
func installIfMissing(ctx context.Context, db DB) error {
	var installed bool
	err := db.QueryRow(ctx, "SELECT to_regprocedure('fenced_lease.enable_by_column(regclass,name)') IS NOT NULL").Scan(&installed)
	if err != nil || installed {
		return err
	}
	return Install(ctx, db)
}

// Check turns a refusal by the database (SQLSTATE FL001) into *fence.Fenced, and a write
// that presented no token (FL003) into an error matching fence.ErrNoToken; any other error is
// returned as it is. Use it on statements of your own that present a token.
func Check(err error) error {
	var pg *pgconn.PgError
	if err == nil || !errors.As(err, &pg) {
		return err
	}
	switch pg.Code {
	case NoTokenSQLState:
		return fmt.Errorf("%w: %s", fence.ErrNoToken, pg.Message)
	case FencedSQLState:
		if f := refusal(pg.Detail); f != nil {
			return f
		}
	}
	return err
}

// refusal reads a refusal's DETAIL: scope=<scope> presented=<t> highest=<h> (the scope runs
// to the last " presented="), or 001's presented=<t> highest=<h>; nil if it reads neither.
func refusal(detail string) *fence.Fenced {
	f := &fence.Fenced{}
	if rest, ok := strings.CutPrefix(detail, "scope="); ok {
		at := strings.LastIndex(rest, " presented=")
		if at < 0 {
			return nil
		}
		f.Scope, detail = rest[:at], rest[at+1:]
	}
	if _, err := fmt.Sscanf(detail, "presented=%d highest=%d", &f.Presented, &f.Highest); err != nil {
		return nil
	}
	return f
}

// Table is a table whose rows are fenced, each identified by its key columns. Names are
// quoted as SQL identifiers (so they are case-sensitive); the name may be schema.table.
type Table struct {
	name string
	keys []string
}

// NewTable is table name, its rows identified by keyColumns.
func NewTable(name string, keyColumns ...string) *Table {
	keys := make([]string, len(keyColumns))
	for i, k := range keyColumns {
		keys[i] = pgx.Identifier{k}.Sanitize()
	}
	return &Table{name: quotePath(name), keys: keys}
}

// quotePath quotes name (schema.table allowed) as SQL identifiers.
func quotePath(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = pgx.Identifier{p}.Sanitize()
	}
	return strings.Join(parts, ".")
}

// Enable fences the table's rows for every client: installs Migrations if missing, then
// fenced_lease.enable(table) adds the fence column (BIGINT NOT NULL DEFAULT 0) if missing
// and the trigger that refuses lower tokens. Idempotent.
func (t *Table) Enable(ctx context.Context, db DB) error {
	if err := installIfMissing(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, "SELECT fenced_lease.enable($1::text::regclass)", t.name)
	return err
}

// Update sets the columns of set on the row with key, if token is not lower than the row's:
// one UPDATE whose fence_token = fenced_lease.accept(fence_token, token). The row must exist
// (ErrNoRow); a lower token is *fence.Fenced.
func (t *Table) Update(ctx context.Context, db DB, key []any, set map[string]any, token int64) error {
	if err := fence.CheckToken(token); err != nil {
		return err
	}
	if len(key) != len(t.keys) {
		return fmt.Errorf("%s is keyed by %d column(s), got %d value(s)", t.name, len(t.keys), len(key))
	}
	fc := pgx.Identifier{FenceColumn}.Sanitize()
	sql := fmt.Sprintf("UPDATE %s SET %s = fenced_lease.accept(%s, $1)", t.name, fc, fc)
	args := []any{token}
	columns := make([]string, 0, len(set))
	for c := range set {
		columns = append(columns, c)
	}
	sort.Strings(columns)
	for _, c := range columns {
		args = append(args, set[c])
		sql += fmt.Sprintf(", %s = $%d", pgx.Identifier{c}.Sanitize(), len(args))
	}
	var where []string
	for i, k := range t.keys {
		args = append(args, key[i])
		where = append(where, fmt.Sprintf("%s = $%d", k, len(args)))
	}
	tag, err := db.Exec(ctx, sql+" WHERE "+strings.Join(where, " AND "), args...)
	if err != nil {
		return Check(err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("row %v of %s: %w", key, t.name, ErrNoRow)
	}
	return nil
}

// Begin starts a transaction fenced as a whole: its first statement checks and records
// token on the row with key, and the row lock it takes holds until commit, so every other
// writer of the row waits. Commit or roll back the returned transaction.
func (t *Table) Begin(ctx context.Context, db Beginner, key []any, token int64) (pgx.Tx, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := t.Update(ctx, tx, key, nil, token); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}
