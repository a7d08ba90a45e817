// Package redis fences Redis (and Valkey) keys through go-redis: the check is a Redis
// Function library shipped in this repository (fence/redis/fenced_lease.lua, embedded here
// as Library), so any client can FCALL it. fenced_call runs one command on one key,
// fenced_set a SET, fenced_batch several commands after one check, each only if the token is
// not lower than the mark in the fence key. A Scope's keys share one fence key,
// {<scope>}:fence (the same hash tag, so the same cluster slot). A lower token is refused
// without touching a key, as *fence.Fenced. The guards load the library when the server
// lacks it.
//
//	account, err := redis.NewScope("42")
//	_, err = account.Call(ctx, rdb, account.Key("payouts"), token, "RPUSH", "a")
//	err = account.Set(ctx, rdb, account.Key("receipt"), "paid", token) // the same mark
//
// Set and Call fence a key by a mark of its own (FenceKey), the compatible form.
package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fenced-lease/fenced-lease/go/fence"
	goredis "github.com/redis/go-redis/v9"
)

// Library is fence/redis/fenced_lease.lua, the Redis Function library fenced_lease.
//
//go:embed fenced_lease.lua
var Library string

// FencedCode starts the error reply of a refused token: FENCED <presented> <highest>.
const FencedCode = "FENCED"

// ErrKey is a key the guard cannot fence (braces but no hash tag).
var ErrKey = errors.New("unusable Redis key")

// Load loads (or replaces) Library on the server.
func Load(ctx context.Context, rdb goredis.Cmdable) error {
	return rdb.FunctionLoadReplace(ctx, Library).Err()
}

// FenceKey is the key holding the highest token accepted for key, in the same cluster slot:
// key:fence when key has a hash tag, else {key}:fence.
func FenceKey(key string) (string, error) {
	if hashTag(key) != key {
		return key + ":fence", nil
	}
	if strings.ContainsAny(key, "{}") {
		return "", fmt.Errorf("%w %q: braces but no hash tag; give it one, e.g. {name}:rest", ErrKey, key)
	}
	return "{" + key + "}:fence", nil
}

// hashTag is the part of key Redis Cluster hashes: the first non-empty {...}, else the key.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

// Check turns the library's refusal (FENCED <presented> <highest>) into *fence.Fenced; any
// other error is returned as it is.
func Check(err error) error {
	if err == nil {
		return nil
	}
	f := strings.Fields(err.Error())
	if len(f) != 3 || f[0] != FencedCode {
		return err
	}
	presented, err1 := strconv.ParseInt(f[1], 10, 64)
	highest, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return err
	}
	return &fence.Fenced{Presented: presented, Highest: highest}
}

// Call runs command (a command name and its arguments after the key, e.g. "HSET", "f",
// "v") on key if token is not lower than the highest accepted for key, and records token
// (FCALL fenced_call). Returns the command's reply.
func Call(ctx context.Context, rdb goredis.Cmdable, key string, token int64, command ...any) (any, error) {
	if len(command) == 0 {
		return nil, errors.New("an empty Redis command")
	}
	return fcall(ctx, rdb, "fenced_call", key, token, command)
}

// Set is SET key value, fenced by token (FCALL fenced_set).
func Set(ctx context.Context, rdb goredis.Cmdable, key, value string, token int64) error {
	_, err := fcall(ctx, rdb, "fenced_set", key, token, []any{value})
	return err
}

func fcall(ctx context.Context, rdb goredis.Cmdable, function, key string, token int64, args []any) (any, error) {
	if err := fence.CheckToken(token); err != nil {
		return nil, err
	}
	fk, err := FenceKey(key)
	if err != nil {
		return nil, err
	}
	reply, err := run(ctx, rdb, function, []string{key, fk}, append([]any{token}, args...))
	var fenced *fence.Fenced
	if errors.As(err, &fenced) {
		fenced.Scope = fk
	}
	return reply, err
}

// run is FCALL function keys args, loading the library first if the server lacks it.
func run(ctx context.Context, rdb goredis.Cmdable, function string, keys []string, args []any) (any, error) {
	reply, err := rdb.FCall(ctx, function, keys, args...).Result()
	if err != nil && strings.Contains(err.Error(), "Function not found") {
		if err := Load(ctx, rdb); err != nil {
			return nil, err
		}
		reply, err = rdb.FCall(ctx, function, keys, args...).Result()
	}
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	return reply, Check(err)
}
