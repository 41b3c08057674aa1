package main

import (
	"os"
	"path/filepath"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestDevicesAreNamedAfterTheNodeAndHealthyUnlessListed(t *testing.T) {
	ids := deviceIDs("real-gpu-01", 3)
	want := []string{"real-gpu-01-gpu-0", "real-gpu-01-gpu-1", "real-gpu-01-gpu-2"}
	for i := range want {
		if ids[i] != want[i] {
			t.Fatalf("ids[%d] = %q, want %q", i, ids[i], want[i])
		}
	}
	devs := devices(ids, map[string]bool{"real-gpu-01-gpu-1": true})
	health := []string{devs[0].Health, devs[1].Health, devs[2].Health}
	if health[0] != pluginapi.Healthy || health[1] != pluginapi.Unhealthy || health[2] != pluginapi.Healthy {
		t.Fatalf("health = %v, want only gpu-1 unhealthy", health)
	}
}

func TestUnhealthyFileSkipsCommentsAndBlanksAndAMissingFileMeansHealthy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "unhealthy")
	got, err := readUnhealthy(path)
	if err != nil || len(got) != 0 {
		t.Fatalf("missing file: got %v, %v; want empty, nil", got, err)
	}
	if err := os.WriteFile(path, []byte("# pulled by the health guard\n\n  n-gpu-3  \nn-gpu-5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = readUnhealthy(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got["n-gpu-3"] || !got["n-gpu-5"] {
		t.Fatalf("got %v, want n-gpu-3 and n-gpu-5", got)
	}
}

func TestAllocationNamesTheGrantedDevicesSortedAndRefusesUnknownOnes(t *testing.T) {
	known := map[string]bool{"n-gpu-0": true, "n-gpu-1": true, "n-gpu-2": true}
	resp, err := allocation([]string{"n-gpu-2", "n-gpu-0"}, known)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Envs["NVIDIA_VISIBLE_DEVICES"]; got != "n-gpu-0,n-gpu-2" {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES = %q, want n-gpu-0,n-gpu-2", got)
	}
	if _, err := allocation([]string{"n-gpu-9"}, known); err == nil {
		t.Fatal("an unknown device was allocated")
	}
}

func TestFingerprintChangesWithHealth(t *testing.T) {
	ids := deviceIDs("n", 2)
	if fingerprint(devices(ids, nil)) == fingerprint(devices(ids, map[string]bool{"n-gpu-0": true})) {
		t.Fatal("a health change must produce a new ListAndWatch update")
	}
}
