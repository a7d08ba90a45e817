package testenv

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
)

// Proxy is a loopback TCP proxy in front of the apiserver, for one client's connections
// only: Cut drops every connection and refuses new ones (an apiserver blip, a partition),
// Heal lets them through again.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewProxy proxies cfg's apiserver and returns the proxy and a copy of cfg that goes
// through it. It stops with the test.
func NewProxy(t testing.TB, cfg *rest.Config) (*Proxy, *rest.Config) {
	t.Helper()
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	through := rest.CopyConfig(cfg)
	through.Host = "https://" + ln.Addr().String()
	if through.TLSClientConfig.ServerName == "" {
		through.TLSClientConfig.ServerName = u.Hostname()
	}
	return p, through
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			_ = in.Close()
			continue
		}
		p.wg.Add(1)
		go p.pipe(in)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) pipe(in net.Conn) {
	defer p.wg.Done()
	out, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(out) {
		_ = in.Close()
		if out != nil {
			_ = out.Close()
		}
		return
	}
	done := make(chan struct{}, 2)
	copyHalf := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go copyHalf(out, in)
	go copyHalf(in, out)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, in)
	delete(p.conns, out)
	p.mu.Unlock()
}

// Cut drops every connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
