package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fenced-lease/fenced-lease/go/fence"
	goredis "github.com/redis/go-redis/v9"
)

// Scope is the keys of one scope, fenced by one mark in {<scope>}:fence: every key of the
// scope carries the hash tag {<scope>}, so the scope lives in one cluster slot.
type Scope struct{ name string }

// NewScope is the scope name (the hash tag its keys carry): non-empty, without braces.
func NewScope(name string) (Scope, error) {
	if name == "" || strings.ContainsAny(name, "{}") {
		return Scope{}, fmt.Errorf("%w: scope %q: a scope is a non-empty hash tag without braces", ErrKey, name)
	}
	return Scope{name: name}, nil
}

// FenceKey is the key holding the scope's mark: {<scope>}:fence.
func (s Scope) FenceKey() string { return "{" + s.name + "}:fence" }

// Key is a key of the scope: <prefix>:{<scope>}.
func (s Scope) Key(prefix string) string { return prefix + ":{" + s.name + "}" }

func (s Scope) checkKey(key string) error {
	if hashTag(key) != s.name {
		return fmt.Errorf("%w %q: not in scope %q, whose keys carry the hash tag {%s}", ErrKey, key, s.name, s.name)
	}
	return nil
}

// Call runs command (a command name and its arguments after the key) on key, a key of the
// scope, if token is not lower than the scope's mark, and raises the mark (FCALL
// fenced_call). Returns the command's reply.
func (s Scope) Call(ctx context.Context, rdb goredis.Cmdable, key string, token int64, command ...any) (any, error) {
	if err := s.checkKey(key); err != nil {
		return nil, err
	}
	if len(command) == 0 {
		return nil, errors.New("an empty Redis command")
	}
	return s.fcall(ctx, rdb, "fenced_call", []string{key, s.FenceKey()}, token, command)
}

// Set is SET key value on a key of the scope, fenced by token (FCALL fenced_set).
func (s Scope) Set(ctx context.Context, rdb goredis.Cmdable, key, value string, token int64) error {
	if err := s.checkKey(key); err != nil {
		return err
	}
	_, err := s.fcall(ctx, rdb, "fenced_set", []string{key, s.FenceKey()}, token, []any{value})
	return err
}

// Batch runs commands in order after one check of token (FCALL fenced_batch): each a command
// name, a key of the scope, then its arguments. Returns their replies. A command that fails
// stops the batch; the ones before it stay (as in MULTI/EXEC).
func (s Scope) Batch(ctx context.Context, rdb goredis.Cmdable, token int64, commands ...[]any) ([]any, error) {
	keys := []string{s.FenceKey()}
	seen := map[string]bool{}
	var args []any
	for _, command := range commands {
		if len(command) < 2 {
			return nil, errors.New("a batched Redis command is a name and a key, then its arguments")
		}
		key, ok := command[1].(string)
		if !ok {
			return nil, fmt.Errorf("%w: the key of a batched command is a string, not %T", ErrKey, command[1])
		}
		if err := s.checkKey(key); err != nil {
			return nil, err
		}
		if !seen[key] {
			seen[key] = true
			keys = append(keys, key)
		}
		args = append(append(args, len(command)), command...)
	}
	if len(commands) == 0 {
		return nil, errors.New("an empty Redis batch")
	}
	reply, err := s.fcall(ctx, rdb, "fenced_batch", keys, token, args)
	if err != nil {
		return nil, err
	}
	replies, _ := reply.([]any)
	return replies, nil
}

// fcall runs FCALL, loading the library if the server lacks it; a refusal names the fence key.
func (s Scope) fcall(ctx context.Context, rdb goredis.Cmdable, function string, keys []string, token int64, args []any) (any, error) {
	if err := fence.CheckToken(token); err != nil {
		return nil, err
	}
	reply, err := run(ctx, rdb, function, keys, append([]any{token}, args...))
	var fenced *fence.Fenced
	if errors.As(err, &fenced) {
		fenced.Scope = s.FenceKey()
	}
	return reply, err
}
