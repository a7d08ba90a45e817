// Command bench-candidate is a fenced leader-election candidate for fenced-lease's
// benchmarks, speaking the line protocol of bench/leaderelection (the client-go candidate),
// so that the two run side by side. It campaigns for the FencedLease NAME with package
// election (with -lock: client-go's own leaderelection.LeaderElector on package lock, the path
// controller-runtime's manager takes) and prints one line per event, stamped with the wall
// clock in nanoseconds since the epoch:
//
//	leading <ns> <token>   OnStartedLeading
//	stopped <ns>           OnStoppedLeading
//	leader <ns> <id>       OnNewLeader
//
// With -wait-stdin it first prints "ready <ns>" and waits for a line on standard input
// before it starts. SIGTERM or SIGINT ends the election, releasing the lease at once.
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

	"github.com/fenced-lease/fenced-lease/go/election"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/fenced-lease/fenced-lease/go/lock"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	namespace := flag.String("namespace", "default", "namespace of the FencedLease")
	name := flag.String("name", "", "name of the FencedLease")
	identity := flag.String("identity", "", "candidate identity")
	waitStdin := flag.Bool("wait-stdin", false, `print "ready" and wait for a line on stdin first`)
	useLock := flag.Bool("lock", false, "elect with client-go's LeaderElector on package lock")
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
	c, err := lease.NewClient(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// One read of the lease before "ready", as the other candidates of the benchmark make: the
	// timed acquire then does not include the connection's TLS handshake (client-go's clients
	// of one config share their transport).
	if clientset, err := kubernetes.NewForConfig(config); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		path := "/apis/fencing.dev/v1alpha1/namespaces/" + *namespace + "/fencedleases/" + *name
		_ = clientset.CoreV1().RESTClient().Get().AbsPath(path).Do(ctx).Error()
		cancel()
	}
	now := func() int64 { return time.Now().UnixNano() }
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The lock reads the lease's duration when it is built: before "ready", as the read above.
	var lk *lock.Lock
	if *useLock {
		if lk, err = lock.New(ctx, config, lock.Config{Namespace: *namespace, Name: *name, Identity: *identity}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if *waitStdin {
		fmt.Println("ready", now())
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	}
	if lk != nil {
		err = runLock(ctx, lk, now)
	} else {
		err = runElection(ctx, c, *namespace, *name, *identity, now)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// runElection campaigns with package election: the token comes in OnStartedLeading.
func runElection(ctx context.Context, c *lease.Client, namespace, name, identity string, now func() int64) error {
	le, err := election.NewLeaderElector(election.LeaderElectionConfig{
		Client: c, Namespace: namespace, Name: name, Identity: identity,
		Callbacks: election.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context, token int64) {
				fmt.Println("leading", now(), token)
				<-ctx.Done()
			},
			OnStoppedLeading: func() { fmt.Println("stopped", now()) },
			OnNewLeader:      func(id string) { fmt.Println("leader", now(), id) },
		},
	})
	if err != nil {
		return err
	}
	return le.Run(ctx)
}

// runLock campaigns with client-go's elector on a lock.Lock, with the lock's timing and
// ReleaseOnCancel, as controller-runtime's manager does; the token is the lock's.
func runLock(ctx context.Context, lk *lock.Lock, now func() int64) error {
	le, err := leaderelection.NewLeaderElector(lk.LeaderElectionConfig(leaderelection.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) {
			token, _ := lk.Token()
			fmt.Println("leading", now(), token)
			<-ctx.Done()
		},
		OnStoppedLeading: func() { fmt.Println("stopped", now()) },
		OnNewLeader:      func(id string) { fmt.Println("leader", now(), id) },
	}))
	if err != nil {
		return err
	}
	le.Run(ctx)
	<-lk.Done() // the claim deleted
	return nil
}
