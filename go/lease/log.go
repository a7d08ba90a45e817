package lease

import (
	"context"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Logger is the logger of ctx, else controller-runtime's root logger (ctrl.Log, which
// writes wherever ctrl.SetLogger says), so that a holder's failures are not discarded by
// default.
func Logger(ctx context.Context) logr.Logger { return ctrllog.FromContext(ctx) }
