package lock

import (
	"context"
	"fmt"

	"github.com/fenced-lease/fenced-lease/go/fence"
)

type tokensKey struct{}

// WithTokens is ctx carrying tokens, for TokensFrom.
func WithTokens(ctx context.Context, tokens fence.TokenSource) context.Context {
	return context.WithValue(ctx, tokensKey{}, tokens)
}

// TokensFrom is the token source ctx carries: in a reconciler of a manager built with
// ManagerOptions, the Lock. Without one, its Token always fails.
func TokensFrom(ctx context.Context) fence.TokenSource {
	if t, ok := ctx.Value(tokensKey{}).(fence.TokenSource); ok {
		return t
	}
	return noTokens{}
}

type noTokens struct{}

func (noTokens) Token() (int64, error) {
	return 0, fmt.Errorf("lock: no token source in this context (build the manager with Lock.ManagerOptions)")
}
