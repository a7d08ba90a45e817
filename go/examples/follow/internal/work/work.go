// Package work is the work of the two example controllers of ../: patching one ConfigMap
// again and again while they lead, and saying how each write went, one line each on
// standard output, for a test to read:
//
//	wrote <n>            the apiserver accepted write n
//	refused <n> <why>    it refused write n (403 Forbidden: an admission policy, say)
//	failed <n> <why>     any other error
//
// It uses client-go only: nothing of fenced-lease.
package work

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

var out sync.Mutex

// Say prints one line on standard output, whole.
func Say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	line := strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " ")
	_, _ = fmt.Fprintln(os.Stdout, line)
}

// Write patches ConfigMap name of namespace ns every `every` until ctx ends, as `who`. The
// ConfigMap must exist.
func Write(ctx context.Context, cs kubernetes.Interface, ns, name, who string, every time.Duration) {
	for n := 1; ; n++ {
		patch := fmt.Sprintf(`{"data":{"n":"%d","by":%q}}`, n, who)
		call, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := cs.CoreV1().ConfigMaps(ns).Patch(call, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		cancel()
		switch {
		case err == nil:
			Say("wrote %d", n)
		case apierrors.IsForbidden(err):
			Say("refused %d %v", n, err)
		case ctx.Err() != nil:
			return
		default:
			Say("failed %d %v", n, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
