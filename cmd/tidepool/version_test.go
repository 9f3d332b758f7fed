package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
)

// TestHelloReportsBuildVersion checks that a real serve reports, as the
// build string of Hello, the version `tidepool version` prints (it used to
// report "dev" whatever the build).
func TestHelloReportsBuildVersion(t *testing.T) {
	out, err := exec.Command(binPath, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(out)) // tidepool VERSION (goX.Y)
	if len(fields) < 2 || fields[0] != "tidepool" {
		t.Fatalf("version printed %q", out)
	}
	want := fields[1]
	d := startDaemon(t)
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := c.Hello(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h.Build != want {
		t.Fatalf("Hello build = %q; tidepool version prints %q", h.Build, want)
	}
}

// TestBuildVersionLdflags checks the three sources of buildVersion in
// order: the -ldflags variable wins; without it the build information of
// this test binary gives a non-empty version.
func TestBuildVersionLdflags(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "1.2.3-test"
	if got := buildVersion(); got != "1.2.3-test" {
		t.Fatalf("buildVersion with -ldflags value = %q", got)
	}
	version = ""
	if got := buildVersion(); got == "" || got == "dev" {
		t.Fatalf("buildVersion without -ldflags = %q", got)
	}
}
