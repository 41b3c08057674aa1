// apiproxy stands between the real nodes' pods and the API server, as a load balancer does in front of a
// production control plane, and injects the network faults the chaos soak draws (tools/chaos): added latency,
// 429 and 5xx answers, connections reset, responses that never come. Pods reach it through the `kubernetes`
// Service; the control plane's own processes and the kubelets keep talking to the API server directly.
//
// It terminates TLS with the API server's serving certificate (valid for the Service's address) and forwards
// each request over TLS to the API server. Pods authenticate with bearer tokens, which pass through unchanged;
// watches stream (each write is flushed at once). Faults are set on a loopback control address:
//
//	PUT /fault {"kind": "latency", "latency_ms": 800, "share": 1, "seconds": 30}
//	GET /fault   the fault in force and counts of what was done
//
// A fault ends by itself after its seconds, so a soak that dies leaves no fault behind.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// Kinds of fault.
const (
	None    = "none"
	Latency = "latency"
	Status  = "status"
	Reset   = "reset"
	Hang    = "hang"
)

// longestHang bounds a response that never comes: past it the request is dropped, whatever the client waits for.
const longestHang = 10 * time.Minute

// Fault is what the control address sets.
type Fault struct {
	Kind      string  `json:"kind"`
	Share     float64 `json:"share"`
	LatencyMS int     `json:"latency_ms"`
	Status    int     `json:"status"`
	Seconds   float64 `json:"seconds"`
	// UserAgents limits the fault to requests whose User-Agent starts with one of these (our agents send
	// `<agent>/<identity>`); none: every request.
	UserAgents []string `json:"user_agents"`
}

func (f Fault) hits(userAgent string) bool {
	if len(f.UserAgents) == 0 {
		return true
	}
	for _, prefix := range f.UserAgents {
		if prefix != "" && strings.HasPrefix(userAgent, prefix) {
			return true
		}
	}
	return false
}

func (f Fault) check() error {
	switch f.Kind {
	case None, Latency, Reset, Hang:
	case Status:
		if f.Status < 400 || f.Status > 599 {
			return fmt.Errorf("status must be 400-599, got %d", f.Status)
		}
	default:
		return fmt.Errorf("kind must be one of none, latency, status, reset, hang; got %q", f.Kind)
	}
	if f.Share < 0 || f.Share > 1 {
		return fmt.Errorf("share must be within 0..1, got %g", f.Share)
	}
	if f.Kind == Latency && (f.LatencyMS <= 0 || f.LatencyMS > 600000) {
		return fmt.Errorf("latency_ms must be within 1..600000, got %d", f.LatencyMS)
	}
	if f.Kind != None && (f.Seconds <= 0 || f.Seconds > 3600) {
		return fmt.Errorf("seconds must be within (0, 3600], got %g", f.Seconds)
	}
	return nil
}

// Faults holds the fault in force and counts what it did.
type Faults struct {
	mu       sync.Mutex
	fault    Fault
	until    time.Time
	now      func() time.Time
	draw     func() float64
	applied  map[string]int
	requests int
}

func NewFaults() *Faults {
	return &Faults{fault: Fault{Kind: None}, now: time.Now, draw: rand.Float64, applied: map[string]int{}}
}

// Set puts f in force for its seconds.
func (s *Faults) Set(f Fault) error {
	if err := f.check(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
	s.until = s.now().Add(time.Duration(f.Seconds * float64(time.Second)))
	return nil
}

// Pick returns the fault a request from userAgent gets (kind none when the fault is over, is not aimed at it, or
// the draw spares it), and counts it.
func (s *Faults) Pick(userAgent string) (Fault, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	f := s.fault
	if f.Kind == None || !s.now().Before(s.until) || !f.hits(userAgent) || s.draw() >= f.Share {
		return Fault{Kind: None}, s.until
	}
	s.applied[f.Kind]++
	return f, s.until
}

// State is what GET /fault answers.
type State struct {
	Fault      Fault          `json:"fault"`
	RemainingS float64        `json:"remaining_s"`
	Applied    map[string]int `json:"applied"`
	Requests   int            `json:"requests"`
}

func (s *Faults) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	remaining := s.until.Sub(s.now()).Seconds()
	f := s.fault
	if remaining <= 0 || f.Kind == None {
		remaining, f = 0, Fault{Kind: None}
	}
	applied := make(map[string]int, len(s.applied))
	for k, v := range s.applied {
		applied[k] = v
	}
	return State{Fault: f, RemainingS: remaining, Applied: applied, Requests: s.requests}
}

// statusBody is a Kubernetes Status, as the API server answers an error, so clients parse it as one.
func statusBody(code int) []byte {
	reason := map[int]string{429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
		504: "Timeout"}[code]
	body, _ := json.Marshal(map[string]any{
		"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
		"message": fmt.Sprintf("injected by apiproxy: %d %s", code, http.StatusText(code)),
		"details": map[string]any{"retryAfterSeconds": 1},
	})
	return body
}

// drop ends the request without an answer: a TCP reset where the connection can be taken over (HTTP/1.1),
// the stream aborted otherwise (HTTP/2).
func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			if tcp, ok := conn.(*net.TCPConn); ok {
				_ = tcp.SetLinger(0)
			} else if tlsConn, ok := conn.(*tls.Conn); ok {
				if tcp, ok := tlsConn.NetConn().(*net.TCPConn); ok {
					_ = tcp.SetLinger(0)
				}
			}
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// Handler forwards to next, applying the fault each request draws.
func Handler(faults *Faults, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, until := faults.Pick(r.UserAgent())
		switch f.Kind {
		case Latency:
			select {
			case <-time.After(time.Duration(f.LatencyMS) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		case Status:
			w.Header().Set("Content-Type", "application/json")
			if f.Status == http.StatusTooManyRequests || f.Status == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			w.WriteHeader(f.Status)
			_, _ = w.Write(statusBody(f.Status))
			return
		case Reset:
			drop(w)
			return
		case Hang:
			ctx, cancel := context.WithDeadline(r.Context(), until.Add(longestHang))
			defer cancel()
			<-ctx.Done()
			drop(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Control serves the fault on the control address.
func Control(faults *Faults) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/fault", func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
		case http.MethodPut:
			var f Fault
			dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&f); err != nil {
				http.Error(w, "fault: not a fault object: "+err.Error(), http.StatusBadRequest)
				return
			}
			if err := faults.Set(f); err != nil {
				http.Error(w, "fault: "+err.Error(), http.StatusBadRequest)
				return
			}
		default:
			http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(faults.State())
	})
	return mux
}

// upstreamProxy forwards to the API server over TLS, verifying it with the cluster's CA, streaming as it goes.
func upstreamProxy(target *url.URL, caFile string) (*httputil.ReverseProxy, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate in it", caFile)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	transport.MaxIdleConnsPerHost = 64
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write(statusBody(http.StatusBadGateway))
		},
	}
	return proxy, nil
}

func main() {
	listen := flag.String("listen", "", "address the pods reach (the kubernetes Service's endpoint)")
	control := flag.String("control", "127.0.0.1:0", "loopback address of the fault control")
	upstream := flag.String("upstream", "", "the API server, https://host:port")
	cert := flag.String("tls-cert-file", "", "serving certificate (the API server's)")
	key := flag.String("tls-private-key-file", "", "its key")
	ca := flag.String("ca-file", "", "the CA the API server's certificate is verified with")
	flag.Parse()
	if *listen == "" || *upstream == "" || *cert == "" || *key == "" || *ca == "" {
		log.Fatal("apiproxy: --listen, --upstream, --tls-cert-file, --tls-private-key-file and --ca-file are required")
	}
	target, err := url.Parse(*upstream)
	if err != nil || target.Scheme != "https" || target.Host == "" {
		log.Fatalf("apiproxy: --upstream must be https://host:port, got %q", *upstream)
	}
	proxy, err := upstreamProxy(target, *ca)
	if err != nil {
		log.Fatalf("apiproxy: --ca-file: %v", err)
	}
	faults := NewFaults()
	controlLn, err := net.Listen("tcp", *control)
	if err != nil {
		log.Fatalf("apiproxy: --control: %v", err)
	}
	go func() { log.Fatal(http.Serve(controlLn, Control(faults))) }()
	server := &http.Server{Addr: *listen, Handler: Handler(faults, proxy), ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: log.New(os.Stderr, "apiproxy: ", log.LstdFlags)}
	log.Printf("apiproxy: %s -> %s, control on %s", *listen, target, controlLn.Addr())
	log.Fatal(server.ListenAndServeTLS(*cert, *key))
}
