// Command elector is a controller elected the way client-go's leaderelection package
// documents it (k8s.io/client-go/examples/leader-election), with no fenced-lease code: a
// Lease lock named -lease, the identity -id (a Deployment passes its pod's name,
// --id=$(POD_NAME)). While it leads it patches ConfigMap -configmap every -every (package
// work prints each outcome), and prints its election's events:
//
//	leading        OnStartedLeading
//	stopped        OnStoppedLeading (then it exits, as the client-go example does)
//	leader <id>    OnNewLeader
//
// A FencedLease with spec.follow naming the Lease fences it without a change here.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fenced-lease/fenced-lease/go/examples/follow/internal/work"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (in-cluster when empty)")
	namespace := flag.String("namespace", "default", "namespace of the Lease and the ConfigMap")
	lease := flag.String("lease", "elector", "name of the Lease lock")
	id := flag.String("id", "", "holder identity (the pod's name)")
	configMap := flag.String("configmap", "elector-work", "the ConfigMap it writes while it leads")
	every := flag.Duration("every", 50*time.Millisecond, "pause between writes")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	flag.Parse()
	if *id == "" {
		fmt.Fprintln(os.Stderr, "-id is required")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cs := kubernetes.NewForConfigOrDie(config)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: *lease, Namespace: *namespace},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *id},
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		ReleaseOnCancel: true,
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				work.Say("leading")
				work.Write(ctx, cs, *namespace, *configMap, *id, *every)
			},
			OnStoppedLeading: func() {
				work.Say("stopped")
				os.Exit(0)
			},
			OnNewLeader: func(identity string) { work.Say("leader %s", identity) },
		},
	})
}
