package redis_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/fence/redis"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	goredis "github.com/redis/go-redis/v9"
)

// connect is a client of FL_REDIS_URL's server, closed with the test.
func connect(t *testing.T) (context.Context, *goredis.Client) {
	url := os.Getenv("FL_REDIS_URL")
	if url == "" {
		if os.Getenv("FL_REQUIRE_CLUSTER") == "1" {
			t.Fatal("FL_REDIS_URL is not set: eval \"$(hack/datastores up)\"")
		}
		t.Skip("FL_REDIS_URL not set")
	}
	opts, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return testenv.Ctx(t, 30*time.Second), rdb
}

func TestTheServerRefusesALowerTokenWithBothTokens(t *testing.T) {
	ctx, rdb := connect(t)
	_ = rdb.FunctionDelete(ctx, "fenced_lease").Err() // the guard loads it when missing
	key := "go-payout:" + testenv.RandomSuffix()
	if err := redis.Set(ctx, rdb, key, "paid by a", 7); err != nil {
		t.Fatal(err)
	}
	err := redis.Set(ctx, rdb, key, "paid by stale", 6)
	var f *fence.Fenced
	if !errors.As(err, &f) || f.Presented != 6 || f.Highest != 7 {
		t.Fatalf("err = %v, want Fenced{6, 7}", err)
	}
	if v := rdb.Get(ctx, key).Val(); v != "paid by a" {
		t.Fatalf("value %q after a refused write", v)
	}
	list := "go-payouts:{" + testenv.RandomSuffix() + "}"
	if n, err := redis.Call(ctx, rdb, list, 7, "RPUSH", "a"); err != nil || n != int64(1) {
		t.Fatalf("RPUSH: %v %v", n, err)
	}
	if _, err := redis.Call(ctx, rdb, list, 3, "RPUSH", "stale"); !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("a stale RPUSH: %v", err)
	}
}

func TestFenceKeysShareTheHashTag(t *testing.T) {
	for key, want := range map[string]string{"payout:42": "{payout:42}:fence", "{user1}:balance": "{user1}:balance:fence"} {
		if got, err := redis.FenceKey(key); err != nil || got != want {
			t.Errorf("FenceKey(%q) = %q, %v; want %q", key, got, err, want)
		}
	}
	for _, bad := range []string{"a{}b", "a}b"} {
		if _, err := redis.FenceKey(bad); !errors.Is(err, redis.ErrKey) {
			t.Errorf("FenceKey(%q): %v", bad, err)
		}
	}
}

// The embedded library is the repository's fence/redis/fenced_lease.lua.
func TestTheEmbeddedLibraryIsTheRepositorys(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "fence", "redis", "fenced_lease.lua"))
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != redis.Library {
		t.Fatal("go/fence/redis/fenced_lease.lua differs from fence/redis/: copy it again")
	}
}

// A stale holder's write to another key of the account is refused by the scope's one mark; a
// batch runs after one check.
func TestAScopesKeysShareOneMark(t *testing.T) {
	ctx, rdb := connect(t)
	account, err := redis.NewScope("go-acct-" + testenv.RandomSuffix())
	if err != nil {
		t.Fatal(err)
	}
	payouts, receipt := account.Key("payouts"), account.Key("receipt")
	if _, err := account.Call(ctx, rdb, payouts, 8, "RPUSH", "b"); err != nil {
		t.Fatal(err)
	}
	err = account.Set(ctx, rdb, receipt, "paid by a", 7)
	var f *fence.Fenced
	if !errors.As(err, &f) || f.Presented != 7 || f.Highest != 8 || f.Scope != account.FenceKey() {
		t.Fatalf("err = %v, want Fenced{%s, 7, 8}", err, account.FenceKey())
	}
	if _, err := account.Batch(ctx, rdb, 7, []any{"RPUSH", payouts, "a"}, []any{"SET", receipt, "a"}); !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("a stale batch: %v", err)
	}
	replies, err := account.Batch(ctx, rdb, 8, []any{"RPUSH", payouts, "b2"}, []any{"SET", receipt, "paid by b"})
	if err != nil || len(replies) != 2 {
		t.Fatalf("a batch: %v %v", replies, err)
	}
	if got := rdb.LRange(ctx, payouts, 0, -1).Val(); len(got) != 2 || got[0] != "b" || got[1] != "b2" {
		t.Fatalf("payouts %v", got)
	}
	if _, err := account.Call(ctx, rdb, "x:{elsewhere}", 9, "DEL"); !errors.Is(err, redis.ErrKey) {
		t.Fatalf("a key outside the scope: %v", err)
	}
}
