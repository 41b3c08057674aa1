package main

import (
	"bufio"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func okUpstream() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "upstream "+r.URL.Path)
	})
}

// serve runs the fault handler in front of next, with the fault f in force.
func serve(t *testing.T, f Fault, next http.Handler) (*httptest.Server, *Faults) {
	t.Helper()
	faults := NewFaults()
	if err := faults.Set(f); err != nil {
		t.Fatalf("set %+v: %v", f, err)
	}
	srv := httptest.NewServer(Handler(faults, next))
	t.Cleanup(srv.Close)
	return srv, faults
}

func TestNoFaultForwards(t *testing.T) {
	srv, faults := serve(t, Fault{Kind: None}, okUpstream())
	resp, err := http.Get(srv.URL + "/api/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "upstream /api/v1/pods" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if s := faults.State(); s.Requests != 1 || len(s.Applied) != 0 {
		t.Fatalf("state %+v", s)
	}
}

func TestStatusAnswersAKubernetesStatus(t *testing.T) {
	srv, faults := serve(t, Fault{Kind: Status, Status: 429, Share: 1, Seconds: 60}, okUpstream())
	resp, err := http.Get(srv.URL + "/api/v1/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var status map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || status["kind"] != "Status" ||
		status["reason"] != "TooManyRequests" || status["code"] != float64(429) {
		t.Fatalf("got %d %v %v", resp.StatusCode, resp.Header, status)
	}
	if faults.State().Applied[Status] != 1 {
		t.Fatalf("not counted: %+v", faults.State())
	}
}

func TestLatencyDelaysTheAnswer(t *testing.T) {
	srv, _ := serve(t, Fault{Kind: Latency, LatencyMS: 300, Share: 1, Seconds: 60}, okUpstream())
	began := time.Now()
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if took := time.Since(began); resp.StatusCode != 200 || took < 300*time.Millisecond {
		t.Fatalf("got %d after %v", resp.StatusCode, took)
	}
}

func TestResetDropsTheConnection(t *testing.T) {
	srv, _ := serve(t, Fault{Kind: Reset, Share: 1, Seconds: 60}, okUpstream())
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(srv.URL + "/api")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d; want the connection dropped", resp.StatusCode)
	}
}

func TestHangNeverAnswers(t *testing.T) {
	srv, _ := serve(t, Fault{Kind: Hang, Share: 1, Seconds: 60}, okUpstream())
	client := &http.Client{Timeout: 400 * time.Millisecond}
	began := time.Now()
	resp, err := client.Get(srv.URL + "/api")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d; want no answer", resp.StatusCode)
	}
	if took := time.Since(began); took < 400*time.Millisecond {
		t.Fatalf("gave up after %v, before the client's timeout", took)
	}
}

func TestAFaultEndsByItselfAndShareZeroSpares(t *testing.T) {
	faults := NewFaults()
	now := time.Unix(1000, 0)
	faults.now = func() time.Time { return now }
	if err := faults.Set(Fault{Kind: Reset, Share: 1, Seconds: 5}); err != nil {
		t.Fatal(err)
	}
	if f, _ := faults.Pick("burst-controller/x"); f.Kind != Reset {
		t.Fatalf("in force: got %q", f.Kind)
	}
	now = now.Add(5 * time.Second)
	if f, _ := faults.Pick("burst-controller/x"); f.Kind != None {
		t.Fatalf("after its seconds: got %q", f.Kind)
	}
	if s := faults.State(); s.Fault.Kind != None || s.RemainingS != 0 {
		t.Fatalf("state after its seconds %+v", s)
	}
	if err := faults.Set(Fault{Kind: Reset, Share: 1, Seconds: 5, UserAgents: []string{"health-guard/"}}); err != nil {
		t.Fatal(err)
	}
	if f, _ := faults.Pick("health-guard/pod-1"); f.Kind != Reset {
		t.Fatalf("aimed at the guard: got %q", f.Kind)
	}
	if f, _ := faults.Pick("virtual-kubelet/v1.14"); f.Kind != None {
		t.Fatalf("not aimed at the virtual kubelet: got %q", f.Kind)
	}
	if s := faults.State(); s.Applied[Reset] != 2 {
		t.Fatalf("state after its seconds %+v", s)
	}
	if err := faults.Set(Fault{Kind: Reset, Share: 0, Seconds: 5}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if f, _ := faults.Pick("burst-controller/x"); f.Kind != None {
			t.Fatalf("share 0 applied %q", f.Kind)
		}
	}
}

func TestControlRefusesABadFaultAndNamesWhy(t *testing.T) {
	srv := httptest.NewServer(Control(NewFaults()))
	defer srv.Close()
	for body, want := range map[string]string{
		`{"kind": "explode", "seconds": 1}`:                   `kind must be one of`,
		`{"kind": "status", "status": 200, "seconds": 1}`:     `status must be 400-599`,
		`{"kind": "latency", "share": 1, "seconds": 1}`:       `latency_ms must be within`,
		`{"kind": "reset", "share": 2, "seconds": 1}`:         `share must be within`,
		`{"kind": "reset", "share": 1}`:                       `seconds must be within`,
		`{"kind": "reset", "share": 1, "seconds": 1, "x": 1}`: `unknown field "x"`,
		`not json`: `not a fault object`,
	} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/fault", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(got), want) {
			t.Errorf("%s: got %d %q, want 400 naming %q", body, resp.StatusCode, got, want)
		}
	}
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/fault",
		strings.NewReader(`{"kind": "latency", "latency_ms": 50, "share": 0.5, "seconds": 30}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var state State
	_ = json.NewDecoder(resp.Body).Decode(&state)
	resp.Body.Close()
	if resp.StatusCode != 200 || state.Fault.Kind != Latency || state.RemainingS <= 29 {
		t.Fatalf("got %d %+v", resp.StatusCode, state)
	}
}

// A watch streams through the proxy: its first event arrives while the API server still holds the response open.
func TestAWatchStreamsThroughTheTLSUpstream(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer token" || r.Header.Get("X-Forwarded-For") == "" {
			w.WriteHeader(401)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"type":"ADDED"}`+"\n")
		w.(http.Flusher).Flush()
		<-release
	}))
	defer upstream.Close()
	defer close(release)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	block := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw})
	if err := os.WriteFile(ca, block, 0o600); err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(upstream.URL)
	proxy, err := upstreamProxy(target, ca)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(NewFaults(), proxy))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/pods?watch=1", nil)
	req.Header.Set("Authorization", "Bearer token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line := make(chan string, 1)
	go func() {
		got, _ := bufio.NewReader(resp.Body).ReadString('\n')
		line <- got
	}()
	select {
	case got := <-line:
		if resp.StatusCode != 200 || !strings.Contains(got, "ADDED") {
			t.Fatalf("got %d %q", resp.StatusCode, got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch's first event did not come through while the stream was open")
	}
}

func TestAnUnreachableAPIServerIsA502Status(t *testing.T) {
	upstream := httptest.NewTLSServer(okUpstream())
	ca := filepath.Join(t.TempDir(), "ca.crt")
	_ = os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw}), 0o600)
	target, _ := url.Parse(upstream.URL)
	upstream.Close()
	proxy, err := upstreamProxy(target, ca)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(NewFaults(), proxy))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || !strings.Contains(string(body), `"kind":"Status"`) {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
}
