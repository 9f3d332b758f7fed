package main

import (
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	raceBinOnce         sync.Once
	raceBin, raceBinErr string
)

// raceBinary returns the serve binary for tests that look for data races
// in the server: under -race, tidepool built with -race (once per test
// binary); otherwise the ordinary one.
func raceBinary(t *testing.T) string {
	t.Helper()
	if !raceEnabled {
		return binPath
	}
	raceBinOnce.Do(func() {
		bin := filepath.Join(filepath.Dir(binPath), "tidepool-race")
		out, err := exec.Command("go", "build", "-race", "-o", bin, ".").CombinedOutput()
		if err != nil {
			raceBinErr = string(out) + err.Error()
			return
		}
		raceBin = bin
	})
	if raceBin == "" {
		t.Fatalf("building tidepool with -race: %s", raceBinErr)
	}
	return raceBin
}
