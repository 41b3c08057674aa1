// fake-gpu-plugin advertises fake GPUs to a real kubelet through the device-plugin API (v1beta1), so
// pods that request nvidia.com/gpu are admitted, counted and run, on CPU. Like NVIDIA's plugin with its
// envvar strategy, Allocate hands the container NVIDIA_VISIBLE_DEVICES with the granted device IDs.
//
// A device listed in --unhealthy-file (one ID per line) is reported Unhealthy, so a test can take a GPU
// away from the kubelet's allocatable count the way a failing GPU does.
//
// Two ways to register. With --registry-dir (<root-dir>/plugins_registry) the kubelet's plugin watcher finds
// our socket there and asks it (pluginregistration v1 GetInfo), which works with several kubelets on one
// host: the device manager's own socket is always /var/lib/kubelet/device-plugins/kubelet.sock, whatever
// --root-dir says, so only one kubelet per host can own it. Without it the plugin calls Register on that
// socket, as NVIDIA's plugin does, and registers again when the kubelet restarts (the kubelet removes every
// plugin socket in that directory when it starts).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// deviceIDs names count devices the way nvidia-smi's index order would: <node>-gpu-<i>.
func deviceIDs(prefix string, count int) []string {
	ids := make([]string, count)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-gpu-%d", prefix, i)
	}
	return ids
}

// devices is the list the kubelet sees: each ID healthy unless named unhealthy.
func devices(ids []string, unhealthy map[string]bool) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(ids))
	for _, id := range ids {
		health := pluginapi.Healthy
		if unhealthy[id] {
			health = pluginapi.Unhealthy
		}
		out = append(out, &pluginapi.Device{ID: id, Health: health})
	}
	return out
}

// readUnhealthy parses the unhealthy file: one device ID per line, '#' comments and blanks ignored.
// A missing file means every device is healthy.
func readUnhealthy(path string) (map[string]bool, error) {
	out := map[string]bool{}
	if path == "" {
		return out, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out[line] = true
	}
	return out, sc.Err()
}

// allocation is what a container gets for the device IDs the kubelet granted it.
func allocation(granted []string, known map[string]bool) (*pluginapi.ContainerAllocateResponse, error) {
	for _, id := range granted {
		if !known[id] {
			return nil, fmt.Errorf("unknown device %q", id)
		}
	}
	ids := append([]string(nil), granted...)
	sort.Strings(ids)
	return &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")},
	}, nil
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	ids           []string
	known         map[string]bool
	unhealthyFile string
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) current() []*pluginapi.Device {
	bad, err := readUnhealthy(p.unhealthyFile)
	if err != nil {
		log.Printf("reading %s: %v (keeping every device healthy)", p.unhealthyFile, err)
	}
	return devices(p.ids, bad)
}

func fingerprint(devs []*pluginapi.Device) string {
	var b strings.Builder
	for _, d := range devs {
		b.WriteString(d.ID + "=" + d.Health + ";")
	}
	return b.String()
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	sent := ""
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		devs := p.current()
		if fp := fingerprint(devs); fp != sent {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
			sent = fp
			log.Printf("advertised %d devices: %s", len(devs), fp)
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-tick.C:
		}
	}
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		a, err := allocation(c.DevicesIds, p.known)
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, a)
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// watcherRegistration answers the kubelet's plugin watcher: a device plugin for resource at endpoint.
type watcherRegistration struct {
	registerapi.UnimplementedRegistrationServer
	resource, endpoint string
}

func (w *watcherRegistration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: w.resource, Endpoint: w.endpoint,
		SupportedVersions: []string{pluginapi.Version}}, nil
}

func (w *watcherRegistration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.PluginRegistered {
		log.Printf("the kubelet registered %s", w.resource)
	} else {
		log.Printf("the kubelet refused %s: %s", w.resource, st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func listen(p *plugin, sock string, registration *watcherRegistration) (*grpc.Server, error) {
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	if registration != nil {
		registerapi.RegisterRegistrationServer(srv, registration)
	}
	go func() { _ = srv.Serve(lis) }()
	return srv, nil
}

// serve listens on our socket and registers it with the kubelet; it returns the server to stop.
func serve(p *plugin, dir, endpoint, resource string) (*grpc.Server, error) {
	srv, err := listen(p, filepath.Join(dir, endpoint), nil)
	if err != nil {
		return nil, err
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	})
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("register with the kubelet: %w", err)
	}
	return srv, nil
}

func main() {
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory (<root-dir>/device-plugins)")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name")
	count := flag.Int("count", 8, "devices to advertise")
	prefix := flag.String("id-prefix", "fake", "device ID prefix (the node's name)")
	unhealthy := flag.String("unhealthy-file", "", "file of device IDs to report Unhealthy, one per line")
	registry := flag.String("registry-dir", "", "the kubelet's plugin-watcher directory (<root-dir>/plugins_registry); "+
		"registers there instead of on the device manager's socket")
	flag.Parse()
	if *count < 1 {
		log.Fatalf("--count must be at least 1, got %d", *count)
	}

	ids := deviceIDs(*prefix, *count)
	known := map[string]bool{}
	for _, id := range ids {
		known[id] = true
	}
	p := &plugin{ids: ids, known: known, unhealthyFile: *unhealthy}
	endpoint := "fakegpu.sock"

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	if *registry != "" {
		if err := os.MkdirAll(*registry, 0o750); err != nil {
			log.Fatal(err)
		}
		sock := filepath.Join(*registry, endpoint)
		srv, err := listen(p, sock, &watcherRegistration{resource: *resource, endpoint: sock})
		if err != nil {
			log.Fatalf("listen on %s: %v", sock, err)
		}
		log.Printf("serving %s with %d devices at %s for the kubelet's plugin watcher", *resource, *count, sock)
		<-stop
		srv.Stop()
		return
	}
	var srv *grpc.Server
	for {
		sock := filepath.Join(*dir, endpoint)
		if _, err := os.Stat(sock); srv == nil || err != nil {
			if srv != nil {
				log.Printf("%s is gone (the kubelet restarted): registering again", sock)
				srv.Stop()
				srv = nil
			}
			s, err := serve(p, *dir, endpoint, *resource)
			if err != nil {
				log.Printf("%v; retrying", err)
			} else {
				srv = s
				log.Printf("registered %s with %d devices at %s", *resource, *count, sock)
			}
		}
		select {
		case <-stop:
			if srv != nil {
				srv.Stop()
			}
			return
		case <-time.After(time.Second):
		}
	}
}
