package fence

import (
	"errors"
	"testing"
)

// Tokens outside what every shipped fence compares exactly are refused before any write.
func TestCheckTokenRefusesTokensNoLeaseIssues(t *testing.T) {
	for _, ok := range []int64{0, 1, MaxToken} {
		if err := CheckToken(ok); err != nil {
			t.Errorf("CheckToken(%d) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []int64{-1, MaxToken + 1, 1 << 62} {
		if err := CheckToken(bad); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("CheckToken(%d) = %v, want ErrInvalidToken", bad, err)
		}
	}
}
