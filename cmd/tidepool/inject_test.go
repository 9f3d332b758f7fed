package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/clitest"
)

// runTool runs the tidepool binary with stdin and returns stdout, stderr
// and the exit code.
func runTool(t *testing.T, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	return clitest.Exec(t, binPath, stdin, args...)
}

// injectedSidecar runs `tidepool inject` on a test input and returns the
// sidecar and its volumes.
func injectedSidecar(t *testing.T, input string) (corev1.Container, []corev1.Volume) {
	t.Helper()
	out, errs, code := runTool(t, nil, "inject", "--image", testImage, filepath.Join("..", "..", "inject", "testdata", "in", input))
	if code != 0 {
		t.Fatalf("tidepool inject: exit %d: %s", code, errs)
	}
	docs := strings.Split(out, "\n---\n")
	var d appsv1.Deployment
	var s appsv1.StatefulSet
	var spec *corev1.PodSpec
	if err := yaml.UnmarshalStrict([]byte(docs[len(docs)-1]), &d); err == nil && d.Kind == "Deployment" {
		spec = &d.Spec.Template.Spec
	} else if err := yaml.UnmarshalStrict([]byte(docs[len(docs)-1]), &s); err == nil {
		spec = &s.Spec.Template.Spec
	} else {
		t.Fatalf("output: %v\n%s", err, out)
	}
	for _, c := range spec.InitContainers {
		if c.Name == "tidepool" {
			return c, spec.Volumes
		}
	}
	t.Fatalf("no sidecar in\n%s", out)
	return corev1.Container{}, nil
}

// clusterFlags are the sidecar's clustering flags; a pod gets them from
// the k8s downward API and Secret, so this test leaves them out.
var clusterFlags = []string{"--bind-addr", "--advertise-addr", "--join", "--gossip-key-file", "--peer-secret-file", "--metrics-addr"}

// The directories an injected pod gives serve, made as the kubelet makes
// an emptyDir (root-owned, mode 0777), are accepted by a real
// `tidepool serve` run with the sidecar's own flags, as root (engine
// images' default user) and as the engine's runAsUser; without
// --trusted-dirs the same serve refuses them.
func TestInjectedSidecarServes(t *testing.T) {
	for _, tc := range []struct{ input, user string }{
		{"vllm.yaml", ""},
		{"statefulset.yaml", "1000"}, // runAsUser 1000, SSD tier on a claim
	} {
		t.Run(tc.input, func(t *testing.T) {
			sc, _ := injectedSidecar(t, tc.input)
			var prefix []string
			if tc.user != "" {
				if os.Geteuid() != 0 {
					t.Skip("running serve as another user needs root")
				}
				if sc.SecurityContext == nil || sc.SecurityContext.RunAsUser == nil || *sc.SecurityContext.RunAsUser != 1000 {
					t.Fatalf("sidecar securityContext %+v: want the engine's runAsUser 1000", sc.SecurityContext)
				}
				prefix = []string{"setpriv", "--reuid=" + tc.user, "--regid=" + tc.user, "--clear-groups"}
				// The binary's directory must be reachable by that user.
				if err := os.Chmod(filepath.Dir(binPath), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			root, err := os.MkdirTemp("", "tpk8s")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(root) })
			if err := os.Chmod(root, 0o755); err != nil {
				t.Fatal(err)
			}
			// Every mount but the Secret, as the kubelet makes an emptyDir.
			for _, m := range sc.VolumeMounts {
				if m.ReadOnly {
					continue
				}
				dir := filepath.Join(root, m.MountPath)
				if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Mkdir(dir, 0o777); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(dir, 0o777); err != nil { // not narrowed by the umask
					t.Fatal(err)
				}
			}
			// The sidecar's arguments, its paths under root, its sizes
			// small, without the cluster flags.
			var args []string
			mountUnder := func(v string) string {
				var parts []string
				for _, p := range strings.Split(v, ",") {
					parts = append(parts, filepath.Join(root, p))
				}
				return strings.Join(parts, ",")
			}
			trusted := ""
		next:
			for _, a := range sc.Args[1:] {
				k, v, _ := strings.Cut(a, "=")
				for _, f := range clusterFlags {
					if k == f {
						continue next
					}
				}
				switch k {
				case "--socket", "--arena-dir", "--data-dir":
					v = mountUnder(v)
				case "--trusted-dirs":
					v = mountUnder(v)
					trusted = v
					continue
				case "--dram-capacity", "--ssd-capacity":
					v = "64MiB"
				}
				args = append(args, k, v)
			}
			if trusted == "" {
				t.Fatalf("sidecar args %q: no --trusted-dirs", sc.Args)
			}
			// Without trusted_dirs: refused, naming the directory.
			argv := append(append(append([]string{}, prefix...), binPath, "serve"), args...)
			argv = append(argv, "--metrics-addr", "")
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "unsafe directory") || !strings.Contains(string(out), root) {
				t.Fatalf("serve without --trusted-dirs: %v\n%s", err, out)
			}
			// With the sidecar's --trusted-dirs it serves, and the
			// engine's user reaches the socket.
			d := startDaemonWith(t, prefix, append(args, "--trusted-dirs", trusted)...)
			var tp []string
			tp = append(tp, prefix...)
			tp = append(tp, binPath, "put", "--socket", d.socket, "k")
			put := exec.Command(tp[0], tp[1:]...)
			put.Stdin = strings.NewReader("value")
			if out, err := put.CombinedOutput(); err != nil {
				t.Fatalf("put as the engine's user: %v\n%s", err, out)
			}
			if out, _, code := d.tp(t, nil, "get", "k"); code != 0 || out != "value" {
				t.Fatalf("get: %d %q", code, out)
			}
			arenas, _ := filepath.Glob(filepath.Join(root, "run/tidepool-arenas/arena-*.mem"))
			if len(arenas) == 0 {
				t.Errorf("no arena files in the arena emptyDir")
			}
		})
	}
}

// `tidepool inject` reads stdin, writes stdout, and on an error writes
// nothing (not even to -o's file) and names the object and field.
func TestInjectCommand(t *testing.T) {
	src, err := os.ReadFile("../../inject/testdata/in/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../inject/testdata/golden/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, errs, code := runTool(t, src, "inject", "--image", "ghcr.io/tidepool-kv/tidepool:test")
	if code != 0 || out != string(want) {
		t.Fatalf("stdin: exit %d, %s\n%s", code, errs, out)
	}
	out, _, code = runTool(t, nil, "inject", "--image", "ghcr.io/tidepool-kv/tidepool:test", "-", "../../inject/testdata/in/deployment.yaml")
	_ = out
	if code != 0 {
		t.Fatalf("two inputs: exit %d", code)
	}

	dst := filepath.Join(t.TempDir(), "out.yaml")
	if err := os.WriteFile(dst, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      containers: [{name: e, image: e}]\n      volumes: [{name: tidepool-socket, hostPath: {path: /x}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, code = runTool(t, nil, "inject", "--image", testImage, "-o", dst, "../../inject/testdata/in/deployment.yaml", bad)
	if code != 1 || out != "" || !strings.Contains(errs, `bad.yaml: document 1 (Deployment "web")`) || !strings.Contains(errs, "spec.template.spec.volumes[0]") {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, out, errs)
	}
	if b, _ := os.ReadFile(dst); string(b) != "old\n" {
		t.Errorf("-o file changed on error: %q", b)
	}
	if out, errs, code = runTool(t, []byte("kind: [\n"), "inject", "--image", testImage); code != 1 || out != "" || !strings.Contains(errs, "<stdin>: document 1: malformed YAML") {
		t.Errorf("malformed stdin: exit %d, stdout %q, stderr %s", code, out, errs)
	}
	if _, errs, code = runTool(t, nil, "inject", "--image", testImage, "--dram-capacity", "1MiB", "-"); code != 2 || !strings.Contains(errs, "dram capacity") {
		t.Errorf("bad flag: exit %d, %s", code, errs)
	}
	// -o on success.
	if _, errs, code = runTool(t, nil, "inject", "--image", "ghcr.io/tidepool-kv/tidepool:test", "-o", dst, "../../inject/testdata/in/deployment.yaml"); code != 0 {
		t.Fatalf("-o: exit %d %s", code, errs)
	}
	if b, _ := os.ReadFile(dst); !bytes.Equal(b, want) {
		t.Errorf("-o file:\n%s", b)
	}
}

// `tidepool webhook` refuses to start without its certificate files.
func TestWebhookCommandNeedsCertificates(t *testing.T) {
	_, errs, code := runTool(t, nil, "webhook", "--image", testImage, "--cert-dir", t.TempDir(), "--health-addr", "")
	if code != 1 || !strings.Contains(errs, "tls.crt") {
		t.Fatalf("exit %d: %s", code, errs)
	}
}

// testImage is the sidecar image the tests name: the test binary is a
// plain `go build`, which has no image of its own (sidecarImage).
const testImage = "ghcr.io/tidepool-kv/tidepool:test"

// TestNoVersionNeedsImage: a binary without a release version (the plain
// build of these tests) refuses to inject or serve the webhook without
// --image, with an error that says so, instead of injecting an image
// tagged with nothing (`...tidepool:`), which a kubelet cannot pull.
func TestNoVersionNeedsImage(t *testing.T) {
	for _, args := range [][]string{
		{"inject", "../../inject/testdata/in/deployment.yaml"},
		{"webhook", "--cert-dir", t.TempDir(), "--health-addr", ""},
	} {
		out, errs, code := runTool(t, nil, args...)
		if code != 2 || out != "" || !strings.Contains(errs, "--image is required") || !strings.Contains(errs, "no release version") {
			t.Fatalf("%s without --image: exit %d, stdout %q..., stderr %s", args[0], code, out[:min(len(out), 200)], errs)
		}
	}
	if out, errs, code := runTool(t, nil, "inject", "--image", testImage, "../../inject/testdata/in/deployment.yaml"); code != 0 || !strings.Contains(out, "image: "+testImage) {
		t.Fatalf("inject --image: exit %d, %s", code, errs)
	}
}

// TestSidecarImage: the default image is tagged with the -ldflags version,
// else the build information's when it is a valid tag; a version that is
// no tag (empty, "(devel)", "+" build metadata) or a pseudo-version (no
// image is published for one) gives none.
func TestSidecarImage(t *testing.T) {
	for _, tc := range []struct{ version, want string }{
		{"v1.4.0", "ghcr.io/tidepool-kv/tidepool:v1.4.0"},
		{"1.4.0-rc.1", "ghcr.io/tidepool-kv/tidepool:1.4.0-rc.1"},
		{"0.1.0-dev+abc123-dirty", ""},
		{"(devel)", ""},
		{"v0.0.0-20261206120000-0123456789ab", ""},
	} {
		if got := sidecarImage(tc.version); got != tc.want {
			t.Errorf("sidecarImage(%q) = %q, want %q", tc.version, got, tc.want)
		}
	}
	// A test binary carries no module version: no image.
	if got := sidecarImage(""); got != "" {
		t.Errorf("sidecarImage(\"\") in a test binary = %q, want none", got)
	}
}
