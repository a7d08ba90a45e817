package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/go-logr/logr"
)

// campaignLocked starts a campaign (and the holder watch) if none runs, the last term's
// elector window is over, and no failure asks to wait. l.mu is held.
func (l *Lock) campaignLocked(now time.Time) {
	if l.stopped || l.ctx.Err() != nil {
		return
	}
	if !l.watching {
		l.watching = true
		l.wg.Add(1)
		go l.watchHolder()
	}
	if l.campaigning || now.Before(l.notBefore) || (!l.ended.IsZero() && now.Before(l.ended.Add(l.cfg.Timing.window()))) {
		return
	}
	l.campaigning = true
	l.wg.Add(1)
	go l.campaign()
}

// campaign queues a claim, waits for the grant, and keeps the term until it ends: one term.
func (l *Lock) campaign() {
	defer l.wg.Done()
	term, err := lease.Acquire(logr.NewContext(l.ctx, l.log), l.client, l.cfg.Namespace, l.cfg.Name, lease.Options{
		Identity: l.cfg.Identity, Pod: l.cfg.Pod, Wait: lease.WaitForever,
		Margin: l.cfg.Margin, RequestTimeout: l.cfg.RequestTimeout,
	})
	if err != nil {
		l.mu.Lock()
		l.campaigning, l.lastErr = false, err
		l.notBefore = time.Now().Add(l.cfg.Timing.RetryPeriod * 5)
		l.mu.Unlock()
		if l.ctx.Err() == nil {
			l.log.Error(err, "campaign failed; the elector's next call tries again")
		}
		return
	}
	token, _ := term.Token()
	l.mu.Lock()
	l.term, l.granted, l.lastUpdate, l.lastErr = term, time.Now(), time.Time{}, nil
	l.mu.Unlock()
	l.log.Info("term granted", "token", token, "claim", term.Claim())

	why := l.keep(term)
	release, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), 10*time.Second)
	if err := term.Release(release); err != nil {
		l.log.Info("could not delete claim; it expires instead", "error", err.Error())
	}
	cancel()
	l.mu.Lock()
	l.term, l.campaigning, l.ended = nil, false, time.Now()
	l.mu.Unlock()
	l.log.Info("term over", "token", token, "why", why)
}

// keep waits until the term ends, or until the elector has not renewed it for the elector
// window (it stopped leading, or never started); says which.
func (l *Lock) keep(term *lease.Lease) string {
	for {
		l.mu.Lock()
		last := l.lastUpdate
		if last.IsZero() {
			last = l.granted
		}
		l.mu.Unlock()
		idle := time.Until(last.Add(l.cfg.Timing.window()))
		if idle <= 0 {
			return "the elector stopped renewing"
		}
		timer := time.NewTimer(idle)
		select {
		case <-term.Done():
			timer.Stop()
			return fmt.Sprint(term.Err())
		case <-timer.C:
		}
	}
}

// watchHolder keeps the holder the lease names, for Get.
func (l *Lock) watchHolder() {
	defer l.wg.Done()
	l.client.WatchHolder(l.ctx, l.cfg.Namespace, l.cfg.Name, func(identity string) {
		l.mu.Lock()
		l.holder = identity
		l.mu.Unlock()
	})
}
