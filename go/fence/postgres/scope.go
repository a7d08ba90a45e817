package postgres

import (
	"context"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/jackc/pgx/v5"
)

// MaxScopeLen is the longest scope name the database takes, in characters.
const MaxScopeLen = 512

// Scope is the name of a resource a lease protects (migration 002): one mark for every write
// of the tables bound to it, whatever rows they touch.
type Scope struct{ name string }

// NewScope is the scope name: 1 to MaxScopeLen characters.
func NewScope(name string) (Scope, error) {
	if n := utf8.RuneCountInString(name); n == 0 || n > MaxScopeLen {
		return Scope{}, fmt.Errorf("invalid scope %q: a scope is a name of 1 to %d characters", name, MaxScopeLen)
	}
	return Scope{name: name}, nil
}

// ScopeOfLease is the default scope of a lease: <namespace>/<name>.
func ScopeOfLease(namespace, name string) Scope { return Scope{name: namespace + "/" + name} }

// String is the scope's name.
func (s Scope) String() string { return s.name }

// Enable binds table (schema.table allowed) to the scope, installing Migrations if missing:
// every write of the table then presents a token checked against the scope's mark, which
// starts at the highest fence_token of the table's rows (a table of migration 001 moves so).
// Idempotent; refused if the table is bound to another scope.
func (s Scope) Enable(ctx context.Context, db DB, table string) error {
	if err := installIfMissing(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, "SELECT fenced_lease.enable($1::text::regclass, $2)", quotePath(table), s.name)
	return Check(err)
}

// Highest is the scope's mark, the highest token its writes presented; ok is false if no
// write and no binding has named the scope.
func (s Scope) Highest(ctx context.Context, db DB) (highest int64, ok bool, err error) {
	err = db.QueryRow(ctx, "SELECT highest FROM fenced_lease.scopes WHERE scope = $1", s.name).Scan(&highest)
	if err == pgx.ErrNoRows {
		return 0, false, nil
	}
	return highest, err == nil, err
}

// Begin starts a transaction whose writes present token (SET LOCAL fenced_lease.token),
// whatever their scopes: each write is checked against its scope's mark, the first raising
// it if token is higher and holding it until the transaction ends. Commit or roll back the
// returned transaction; pass its errors through Check.
func (s Scope) Begin(ctx context.Context, db Beginner, token int64) (pgx.Tx, error) {
	return Begin(ctx, db, token)
}

// Begin starts a transaction whose writes present token, whatever their scopes (tables
// bound by a column, or to several scopes).
func Begin(ctx context.Context, db Beginner, token int64) (pgx.Tx, error) {
	if err := fence.CheckToken(token); err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('fenced_lease.token', $1, true)", strconv.FormatInt(token, 10)); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// EnableByColumn binds table by its column scopeColumn: each row's write presents a token
// checked against the mark of the scope the row names (both when an update moves it), so one
// table holds the data of many leases. Installs Migrations if missing.
func EnableByColumn(ctx context.Context, db DB, table, scopeColumn string) error {
	if err := installIfMissing(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, "SELECT fenced_lease.enable_by_column($1::text::regclass, $2)", quotePath(table), scopeColumn)
	return Check(err)
}
