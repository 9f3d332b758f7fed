package inject

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files of TestInjectGolden")

// testConfig is the injector configuration of the golden files.
func testConfig() Config { return DefaultConfig("test") }

// podSpecs returns every pod spec in decoded objects.
func podSpecs(objs []any) []*corev1.PodTemplateSpec {
	var out []*corev1.PodTemplateSpec
	for _, o := range objs {
		switch x := o.(type) {
		case *corev1.Pod:
			out = append(out, &corev1.PodTemplateSpec{ObjectMeta: x.ObjectMeta, Spec: x.Spec})
		case *appsv1.Deployment:
			out = append(out, &x.Spec.Template)
		case *appsv1.StatefulSet:
			out = append(out, &x.Spec.Template)
		case *leaderWorkerSet:
			out = append(out, &x.Spec.LeaderWorkerTemplate.WorkerTemplate)
			if x.Spec.LeaderWorkerTemplate.LeaderTemplate != nil {
				out = append(out, x.Spec.LeaderWorkerTemplate.LeaderTemplate)
			}
		}
	}
	return out
}

func TestInjectGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/in/*.yaml")
	if err != nil || len(files) < 7 {
		t.Fatalf("inputs: %v %v", files, err)
	}
	for _, in := range files {
		name := filepath.Base(in)
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			src, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			out, err := testConfig().File(name, src)
			if err != nil {
				t.Fatalf("inject: %v", err)
			}
			golden := filepath.Join("testdata", "golden", name)
			if *update {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("output differs from %s (run with -update after checking):\n%s", golden, out)
			}
			// Every document decodes strictly into its type, and every
			// pod carries exactly one sidecar that the engines can reach.
			objs, err := decodeStrict(out, nil)
			if err != nil {
				t.Fatalf("strict decode: %v", err)
			}
			pods := podSpecs(objs)
			if len(pods) == 0 {
				t.Fatal("no pod template in the output")
			}
			for _, p := range pods {
				checkInjected(t, p)
			}
			// Idempotent: injecting the output changes nothing.
			again, err := testConfig().File(name, out)
			if err != nil {
				t.Fatalf("second inject: %v", err)
			}
			if !bytes.Equal(again, out) {
				t.Errorf("injecting twice changed the output:\n%s", again)
			}
			if strings.HasPrefix(name, "already-injected") && !bytes.Equal(out, src) {
				t.Errorf("an injected input changed:\n%s", out)
			}
		})
	}
}

// checkInjected checks what every injected pod must have.
func checkInjected(t *testing.T, p *corev1.PodTemplateSpec) {
	t.Helper()
	n := 0
	var sc corev1.Container
	for _, c := range p.Spec.InitContainers {
		if c.Name == ContainerName {
			n++
			sc = c
		}
	}
	if n != 1 {
		t.Fatalf("%d tidepool init containers", n)
	}
	if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("sidecar restartPolicy %v, want Always", sc.RestartPolicy)
	}
	if sc.ReadinessProbe == nil || sc.ReadinessProbe.HTTPGet.Path != "/readyz" || sc.LivenessProbe == nil || sc.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("probes: %+v %+v", sc.ReadinessProbe, sc.LivenessProbe)
	}
	if _, ok := sc.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Errorf("sidecar has no memory limit")
	}
	var socket string
	for _, a := range sc.Args {
		if v, ok := strings.CutPrefix(a, "--socket="); ok {
			socket = v
		}
	}
	vols := map[string]corev1.Volume{}
	for _, v := range p.Spec.Volumes {
		if _, dup := vols[v.Name]; dup {
			t.Errorf("volume %q twice", v.Name)
		}
		vols[v.Name] = v
	}
	if v := vols[VolumeArenas]; v.EmptyDir == nil || v.EmptyDir.Medium == "" {
		t.Errorf("arena volume %+v: want a memory or hugepages emptyDir", v)
	}
	engines := 0
	for _, c := range p.Spec.Containers {
		var env string
		for _, e := range c.Env {
			if e.Name == EnvSocket {
				env = e.Value
			}
		}
		if env == "" {
			continue // not an engine (tidepool.io/containers)
		}
		engines++
		if env != socket {
			t.Errorf("container %s: %s=%q, sidecar socket %q", c.Name, EnvSocket, env, socket)
		}
		mounts := map[string]string{}
		for _, m := range c.VolumeMounts {
			mounts[m.Name] = m.MountPath
		}
		if mounts[VolumeSocket] != filepath.Dir(socket) || mounts[VolumeArenas] != ArenaMountPath {
			t.Errorf("container %s mounts %v", c.Name, mounts)
		}
	}
	if engines == 0 {
		t.Errorf("no container has %s", EnvSocket)
	}
}

func TestInjectBadInput(t *testing.T) {
	deploy := func(spec string) string {
		return "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  selector: {matchLabels: {app: d}}\n" + spec
	}
	for _, tc := range []struct {
		name, in string
		want     error
		msg      []string // substrings of the error
	}{
		{"malformed YAML", "apiVersion: v1\nkind: Pod\nmetadata: [\n", ErrInvalid, []string{"in.yaml", "document 1", "malformed YAML"}},
		{"second document malformed", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\nkind: : :\n", ErrInvalid, []string{"document 2", "malformed"}},
		{"not an object", "- a\n- b\n", ErrInvalid, []string{"document 1", "not a Kubernetes object"}},
		{"no kind", "metadata: {name: x}\n", ErrInvalid, []string{"apiVersion, kind: missing"}},
		{"deployment without template", deploy(""), ErrInvalid, []string{`Deployment "d"`, "spec.template: missing"}},
		{"template without spec", deploy("  template:\n    metadata: {labels: {app: d}}\n"), ErrInvalid, []string{"spec.template.spec: missing"}},
		{"template not a mapping", deploy("  template: [1]\n"), ErrInvalid, []string{"spec.template: not a pod template"}},
		{"wrong field type", deploy("  template:\n    spec:\n      containers: nope\n"), ErrInvalid, []string{"spec.template", "cannot unmarshal"}},
		{"no containers", deploy("  template:\n    spec:\n      containers: []\n"), ErrInvalid, []string{"spec.template.spec.containers: empty"}},
		{"list", "apiVersion: v1\nkind: List\nitems: []\n", ErrInvalid, []string{"List is not supported"}},
		{"conflicting volume", deploy("  template:\n    spec:\n      containers: [{name: e, image: e}]\n      volumes:\n      - {name: data, emptyDir: {}}\n      - {name: tidepool-arenas, hostPath: {path: /mnt}}\n"),
			ErrConflict, []string{`Deployment "d"`, "spec.template.spec.volumes[1]", `"tidepool-arenas"`, "hostPath /mnt"}},
		{"same-name emptyDir of another medium", deploy("  template:\n    spec:\n      containers: [{name: e, image: e}]\n      volumes:\n      - {name: tidepool-arenas, emptyDir: {}}\n"),
			ErrConflict, []string{"spec.template.spec.volumes[0]", "medium Memory"}},
		{"mount path taken", deploy("  template:\n    spec:\n      containers:\n      - name: e\n        image: e\n        volumeMounts: [{name: x, mountPath: /run/tidepool}]\n      volumes: [{name: x, emptyDir: {}}]\n"),
			ErrConflict, []string{"spec.template.spec.containers[0].volumeMounts[0]", `"x" is mounted at /run/tidepool`}},
		{"regular container named tidepool", deploy("  template:\n    spec:\n      containers: [{name: e, image: e}, {name: tidepool, image: t}]\n"),
			ErrConflict, []string{"spec.template.spec.containers[1]", "native sidecar"}},
		{"bad capacity annotation", deploy("  template:\n    metadata:\n      annotations: {tidepool.io/dram-capacity: lots}\n    spec:\n      containers: [{name: e, image: e}]\n"),
			ErrInvalid, []string{`spec.template.metadata.annotations["tidepool.io/dram-capacity"]`, "not a size"}},
		{"capacity too small", deploy("  template:\n    metadata:\n      annotations: {tidepool.io/dram-capacity: 1MiB}\n    spec:\n      containers: [{name: e, image: e}]\n"),
			ErrInvalid, []string{"dram capacity 1MiB"}},
		{"relative socket", deploy("  template:\n    metadata:\n      annotations: {tidepool.io/socket: tp.sock}\n    spec:\n      containers: [{name: e, image: e}]\n"),
			ErrInvalid, []string{`socket "tp.sock"`}},
		{"unknown engine container", deploy("  template:\n    metadata:\n      annotations: {tidepool.io/containers: vllm}\n    spec:\n      containers: [{name: e, image: e}]\n"),
			ErrInvalid, []string{`no container "vllm"`}},
		{"ssd volume missing", deploy("  template:\n    metadata:\n      annotations: {tidepool.io/ssd-volume: nvme}\n    spec:\n      containers: [{name: e, image: e}]\n"),
			ErrInvalid, []string{`no volume "nvme"`}},
		{"runAsNonRoot without a user", deploy("  template:\n    spec:\n      securityContext: {runAsNonRoot: true}\n      containers: [{name: e, image: e}]\n"),
			ErrInvalid, []string{"spec.template.spec.securityContext", "runAsUser"}},
		{"engines of two users", deploy("  template:\n    metadata:\n      annotations: {tidepool.io/containers: \"a,b\"}\n    spec:\n      containers:\n      - {name: a, image: e, securityContext: {runAsUser: 1}}\n      - {name: b, image: e, securityContext: {runAsUser: 2}}\n"),
			ErrConflict, []string{"spec.template.spec.containers[1].securityContext.runAsUser"}},
		{"hugepages of a bad size", deploy("  template:\n    metadata:\n      annotations: {tidepool.io/hugepages: 4Ki}\n    spec:\n      containers: [{name: e, image: e}]\n"),
			ErrInvalid, []string{`hugepages "4Ki"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := testConfig().File("in.yaml", []byte(tc.in))
			if err == nil {
				t.Fatalf("no error; output:\n%s", out)
			}
			if out != nil {
				t.Errorf("output with the error: %q", out)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("error %v: want %v", err, tc.want)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q lacks %q", err, m)
				}
			}
		})
	}
}

// A document with a later error leaves nothing written: File returns
// nothing for the whole stream, even when earlier documents were fine.
func TestInjectAllOrNothing(t *testing.T) {
	good, err := os.ReadFile("testdata/in/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	in := append(append([]byte{}, good...), []byte("---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: broken}\nspec: {}\n")...)
	out, err := testConfig().File("in.yaml", in)
	if err == nil || out != nil || !strings.Contains(err.Error(), `document 2 (Deployment "broken")`) {
		t.Fatalf("out %q, err %v", out, err)
	}
}

// Objects without pods pass through byte for byte.
func TestInjectPassThrough(t *testing.T) {
	in := []byte("# config\napiVersion: v1\nkind: ConfigMap\nmetadata:\n    name: c   # odd indent kept\ndata: {a: b}\n")
	out, err := testConfig().File("in.yaml", in)
	if err != nil || !bytes.Equal(out, in) {
		t.Fatalf("out %q, err %v", out, err)
	}
}

// A pod labelled tidepool.io/inject: "false" is left alone.
func TestInjectOptOut(t *testing.T) {
	in := []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  labels: {tidepool.io/inject: \"false\"}\nspec:\n  containers: [{name: e, image: e}]\n")
	out, err := testConfig().File("in.yaml", in)
	if err != nil || !bytes.Equal(out, in) {
		t.Fatalf("out %q, err %v", out, err)
	}
}

// Without tidepool.io/containers the engine is kubectl's default
// container, else the first that is not a mesh proxy; other containers
// get neither the socket nor the arenas, and their users do not matter.
func TestInjectEngineChoice(t *testing.T) {
	for _, tc := range []struct {
		name, meta string
		want       string
	}{
		{"first container", "", "engine"},
		{"after a mesh proxy", "", "engine"},
		{"default-container annotation", "  annotations: {kubectl.kubernetes.io/default-container: engine}\n", "engine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			containers := "  - {name: engine, image: e}\n  - {name: shipper, image: s, securityContext: {runAsUser: 7}}\n"
			if tc.name != "first container" {
				containers = "  - {name: istio-proxy, image: p, securityContext: {runAsUser: 1337}}\n" + containers
			}
			if tc.meta != "" {
				containers = "  - {name: shipper2, image: s}\n" + containers
			}
			in := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n" + tc.meta + "spec:\n  containers:\n" + containers
			out, err := testConfig().File("in.yaml", []byte(in))
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeStrict(out, nil)
			if err != nil {
				t.Fatal(err)
			}
			pod := objs[0].(*corev1.Pod)
			for _, c := range pod.Spec.Containers {
				has := slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == EnvSocket })
				if has != (c.Name == tc.want) {
					t.Errorf("container %s: %s set %v", c.Name, EnvSocket, has)
				}
			}
			for _, c := range pod.Spec.InitContainers {
				if c.Name == ContainerName && (c.SecurityContext.RunAsUser == nil || *c.SecurityContext.RunAsUser != 0) {
					t.Errorf("sidecar runs as %v, want the engine's (root)", c.SecurityContext.RunAsUser)
				}
			}
		})
	}
}

// File never panics, and what it returns for any input injects to
// itself (idempotence holds beyond the golden inputs).
func FuzzInjectFile(f *testing.F) {
	files, _ := filepath.Glob("testdata/in/*.yaml")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: &m {name: p}\nspec: {containers: [{name: e, image: e}]}\n---\nkind: Pod\napiVersion: v1\nmetadata: *m\nspec: {containers: [{name: e}]}\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := testConfig().File("fuzz.yaml", in)
		if err != nil {
			if out != nil {
				t.Fatalf("output with an error")
			}
			return
		}
		again, err := testConfig().File("fuzz.yaml", out)
		if err != nil {
			t.Fatalf("injecting the output: %v\n%s", err, out)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent:\n%s\n---- then\n%s", out, again)
		}
	})
}
