// A client-go leader-election candidate for fenced-lease's benchmarks: it takes the
// coordination.k8s.io Lease NAME with tools/leaderelection and prints one line per event,
// stamped with the wall clock in nanoseconds since the epoch:
//
//	leading <ns>       OnStartedLeading
//	stopped <ns>       OnStoppedLeading
//	leader <ns> <id>   OnNewLeader
//
// With -wait-stdin it first prints "ready <ns>" and waits for a line on standard input
// before it starts (so a benchmark times the election, not the process start).
//
// SIGTERM or SIGINT cancels the election; with -release-on-cancel (default) the lease is
// given up at once, as a graceful shutdown does.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	namespace := flag.String("namespace", "default", "namespace of the Lease")
	name := flag.String("name", "", "name of the Lease")
	identity := flag.String("identity", "", "holder identity")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	release := flag.Bool("release-on-cancel", true, "ReleaseOnCancel")
	waitStdin := flag.Bool("wait-stdin", false, `print "ready" and wait for a line on stdin first`)
	flag.Parse()
	if *name == "" || *identity == "" {
		fmt.Fprintln(os.Stderr, "-name and -identity are required")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	config.QPS, config.Burst = 1000, 1000
	client := kubernetes.NewForConfigOrDie(config)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: *name, Namespace: *namespace},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
	}
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-signals; cancel() }()
	stamp := func() int64 { return time.Now().UnixNano() }
	if *waitStdin {
		// A first request warms the client's connection, as a running controller's is.
		_, _ = client.CoordinationV1().Leases(*namespace).Get(ctx, *name, metav1.GetOptions{})
		fmt.Printf("ready %d\n", stamp())
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: *release,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { fmt.Printf("leading %d\n", stamp()) },
			OnStoppedLeading: func() { fmt.Printf("stopped %d\n", stamp()) },
			OnNewLeader:      func(id string) { fmt.Printf("leader %d %s\n", stamp(), id) },
		},
	})
}
