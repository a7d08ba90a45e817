// Command manager is a controller-runtime manager with leader election as kubebuilder
// scaffolds it (LeaderElection: true, the default identity <hostname>_<uuid>: in a pod, its
// name), with no fenced-lease code. Its one runnable, which needs leadership, patches
// ConfigMap -configmap every -every while the manager leads (package work prints each
// outcome), after printing "leading"; when leadership is lost the manager stops, as
// controller-runtime does, and it prints "stopped".
//
// A FencedLease with spec.follow naming the Lease (-lease, the manager's LeaderElectionID)
// fences it without a change here.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/fenced-lease/fenced-lease/go/examples/follow/internal/work"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

func main() {
	namespace := flag.String("namespace", "default", "namespace of the Lease and the ConfigMap")
	lease := flag.String("lease", "manager", "LeaderElectionID: the Lease's name")
	configMap := flag.String("configmap", "manager-work", "the ConfigMap it writes while it leads")
	every := flag.Duration("every", 50*time.Millisecond, "pause between writes")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	flag.Parse() // and controller-runtime's own -kubeconfig
	config := ctrl.GetConfigOrDie()
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		LeaderElection:          true,
		LeaderElectionID:        *lease,
		LeaderElectionNamespace: *namespace,
		LeaseDuration:           leaseDuration,
		RenewDeadline:           renewDeadline,
		RetryPeriod:             retryPeriod,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cs := kubernetes.NewForConfigOrDie(config)
	who, _ := os.Hostname()
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		work.Say("leading")
		work.Write(ctx, cs, *namespace, *configMap, who, *every)
		return nil
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	err = mgr.Start(ctrl.SetupSignalHandler())
	work.Say("stopped")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
