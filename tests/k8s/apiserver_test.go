package k8s

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/diff"
	"sigs.k8s.io/yaml"
)

// testImage is the sidecar image both the webhook and `tidepool inject`
// are given, so their outputs can be compared.
const testImage = "ghcr.io/tidepool-kv/tidepool:test"

// cliNamespace is where pods injected by `tidepool inject` are stored to
// be compared: a namespace the webhook does not select, which would
// otherwise inject them again with its own configuration.
const cliNamespace = "plain"

// TestAgainstAPIServer is tidepool's deploy/ and webhook against a real
// kube-apiserver (built by scripts/k8s-apiserver.sh) on etcd, on loopback:
// the CRDs of cert-manager and the Prometheus Operator from their pinned
// releases, `kubectl apply -k deploy/` and `deploy/examples/`, then pods
// created as their controllers would create them, injected by the API
// server calling a real `tidepool webhook`, read back from storage and
// compared with `tidepool inject`'s output stored the same way.
//
// No controller-manager, scheduler or kubelet: pods are stored, not run.
// `make test-k8s` sets the environment; see docs/kubernetes.md.
func TestAgainstAPIServer(t *testing.T) {
	apiserver, tidepool := os.Getenv("TIDEPOOL_KUBE_APISERVER"), os.Getenv("TIDEPOOL_BIN")
	if apiserver == "" || tidepool == "" {
		t.Skip("needs TIDEPOOL_KUBE_APISERVER and TIDEPOOL_BIN: run `make test-k8s`")
	}
	crds := strings.Fields(os.Getenv("TIDEPOOL_CRDS"))
	if len(crds) == 0 {
		t.Fatal("TIDEPOOL_CRDS: no CRD files (scripts/test-k8s.sh names cert-manager's and the Prometheus Operator's)")
	}
	c := startCluster(t, apiserver)
	ctx := context.Background()

	// The CRDs first, as a user installs cert-manager and the operator
	// first. Server-side: cert-manager's Issuer CRD is over the 256 KiB
	// limit of client-side apply's last-applied annotation.
	for _, f := range crds {
		if out, err := c.kubectl("apply", "--server-side", "-f", f); err != nil {
			t.Fatalf("kubectl apply %s: %v\n%s", f, err, out)
		}
		// kubectl 1.32's wait fails outright ("conditions accessor
		// error") while the new CRD has no conditions yet: ask again.
		waitFor(t, "CRD of "+f+" established", c.apiserver, 2*time.Minute, func() error {
			if out, err := c.kubectl("wait", "--for=condition=Established", "--timeout=10s", "-f", f); err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	}

	// deploy/ exactly as docs/kubernetes.md says to apply it.
	out, err := c.kubectl("apply", "-k", "../../deploy/")
	if err != nil {
		t.Fatalf("kubectl apply -k deploy/: %v\n%s", err, out)
	}
	t.Logf("kubectl apply -k deploy/:\n%s", out)
	wantObjects(t, c, "../../deploy/", 8)
	out, err = c.kubectl("apply", "-k", "../../deploy/examples/")
	if err != nil {
		t.Fatalf("kubectl apply -k deploy/examples/: %v\n%s", err, out)
	}
	t.Logf("kubectl apply -k deploy/examples/:\n%s", out)
	wantObjects(t, c, "../../deploy/examples/", 3)

	// Without a controller-manager nobody makes a namespace's default
	// ServiceAccount, which the ServiceAccount admission plugin requires
	// of every pod.
	for _, ns := range []string{"plain", "inference", "tidepool-system"} {
		if ns == "plain" {
			if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
		if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var vllm appsv1.Deployment
	readObject(t, "../../deploy/examples/vllm.yaml", &vllm)
	vllmPod := podFromTemplate("vllm-5d8f7c9b4-x2x9z", &vllm.Spec.Template, "inference")

	// As applied, the configuration names the Service tidepool-webhook,
	// which has no endpoints here (no pods run) and no caBundle (no
	// cert-manager): the webhook is unreachable, and with the documented
	// failurePolicy Ignore the pod is stored without the sidecar.
	// The API server loads webhook configurations through an informer:
	// wait until this one is in effect, as a dry-run create failing open
	// through it shows.
	const hook = "namespace.inject.tidepool.io"
	waitFor(t, "deploy/'s webhook configuration in effect", c.apiserver, 2*time.Minute, func() error {
		dryRunPod(t, c, vllmPod)
		if c.failedOpen(hook) == 0 {
			return fmt.Errorf("no %q failing open in the API server's log yet", hook)
		}
		return nil
	})
	t.Run("unreachable webhook, Ignore: stored without the sidecar", func(t *testing.T) {
		storedFailingOpen(t, c, hook, vllmPod, "vllm-unreachable")
	})

	// The webhook on loopback, and the configuration pointed at it: the
	// URL stands for the Service (kube-proxy's part), the caBundle for
	// cert-manager's CA injector. Everything else is deploy/'s.
	wh := startWebhook(t, c, tidepool)
	mwc := registerWebhook(t, c, wh.url)
	waitFor(t, "the webhook's URL in effect", c.apiserver, 2*time.Minute, func() error {
		if p, err := dryRunPod(t, c, vllmPod); err != nil || !hasSidecar(p) {
			return fmt.Errorf("dry-run pod not injected yet (%v)", err)
		}
		return nil
	})

	t.Run("example vLLM pod: injected, same as tidepool inject", func(t *testing.T) {
		got := createPod(t, c, vllmPod.DeepCopy())
		sc := sidecarOf(got)
		if sc == nil {
			t.Fatalf("stored pod has no tidepool init container:\n%s", toYAML(got.Spec))
		}
		if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways || sc.Image != testImage {
			t.Errorf("sidecar restartPolicy %v image %q", sc.RestartPolicy, sc.Image)
		}
		for _, a := range []string{"--dram-capacity=32GiB", "--ssd-capacity=200GiB"} {
			if !contains(sc.Args, a) {
				t.Errorf("sidecar args %q lack %s (the Deployment's annotations)", sc.Args, a)
			}
		}
		want := injectCLI(t, tidepool, vllmPod)
		want.Name, want.Namespace = vllmPod.Name+"-cli", cliNamespace
		compareStored(t, got, createPod(t, c, want))
	})

	t.Run("StatefulSet pod with its claim as the SSD tier", func(t *testing.T) {
		var set appsv1.StatefulSet
		readObject(t, "../../inject/testdata/in/statefulset.yaml", &set)
		set.Namespace = "inference"
		if _, err := c.client.AppsV1().StatefulSets("inference").Create(ctx, &set, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create StatefulSet: %v", err)
		}
		got := createPod(t, c, statefulSetPod(&set, 0))
		if sidecarOf(got) == nil {
			t.Fatalf("stored pod has no tidepool init container:\n%s", toYAML(got.Spec))
		}
		var injected appsv1.StatefulSet
		injectObject(t, tidepool, "../../inject/testdata/in/statefulset.yaml", &injected)
		injected.Name, injected.Namespace = injected.Name+"-cli", cliNamespace
		compareStored(t, got, createPod(t, c, statefulSetPod(&injected, 0)))
	})

	t.Run("LeaderWorkerSet meets its CRD's schema, injected", func(t *testing.T) {
		raw, err := os.ReadFile("../../inject/testdata/in/lws.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if out, err := c.kubectlIn(raw, "create", "--validate=strict", "-n", "inference", "-f", "-"); err != nil {
			t.Fatalf("kubectl create LeaderWorkerSet: %v\n%s", err, out)
		}
		injected := bytes.Replace(runInject(t, tidepool, raw), []byte("name: vllm-multinode\n"), []byte("name: vllm-multinode-cli\n"), 1)
		if out, err := c.kubectlIn(injected, "create", "--validate=strict", "-n", "inference", "-f", "-"); err != nil {
			t.Fatalf("kubectl create the injected LeaderWorkerSet: %v\n%s", err, out)
		}
	})

	t.Run("LeaderWorkerSet leader and worker pods", func(t *testing.T) {
		var in, injected lwsTemplates
		readObject(t, "../../inject/testdata/in/lws.yaml", &in)
		injectObject(t, tidepool, "../../inject/testdata/in/lws.yaml", &injected)
		for i, pair := range [][2]*corev1.PodTemplateSpec{
			{in.Spec.LeaderWorkerTemplate.LeaderTemplate, injected.Spec.LeaderWorkerTemplate.LeaderTemplate},
			{in.Spec.LeaderWorkerTemplate.WorkerTemplate, injected.Spec.LeaderWorkerTemplate.WorkerTemplate},
		} {
			name := fmt.Sprintf("vllm-multinode-0-%d", i)
			got := createPod(t, c, podFromTemplate(name, pair[0], "inference"))
			if sidecarOf(got) == nil {
				t.Fatalf("%s: stored pod has no tidepool init container", name)
			}
			compareStored(t, got, createPod(t, c, podFromTemplate(name+"-cli", pair[1], cliNamespace)))
		}
	})

	t.Run("selectors", func(t *testing.T) {
		for _, tc := range []struct {
			ns, label string // label: the pod's tidepool.io/inject, "" for none
			want      bool
		}{
			{"plain", "", false},               // unlabelled namespace
			{"plain", "true", true},            // opted in by the pod's label
			{"inference", "false", false},      // opted out by the pod's label
			{"inference", "", true},            // labelled namespace
			{"tidepool-system", "true", false}, // the webhook's own namespace, never
		} {
			p := vllmPod.DeepCopy()
			p.Namespace = tc.ns
			p.Name = "sel-" + tc.ns + "-" + tc.label
			p.Name = strings.TrimSuffix(p.Name, "-")
			if tc.label != "" {
				p.Labels["tidepool.io/inject"] = tc.label
			}
			if got := hasSidecar(createPod(t, c, p)); got != tc.want {
				t.Errorf("namespace %s, pod label %q: injected %v, want %v", tc.ns, tc.label, got, tc.want)
			}
		}
	})

	t.Run("a pod the injector refuses is denied with the reason", func(t *testing.T) {
		p := vllmPod.DeepCopy()
		p.Name = "vllm-bad-annotation"
		p.Annotations["tidepool.io/dram-capacity"] = "lots"
		_, err := c.client.CoreV1().Pods("inference").Create(ctx, p, metav1.CreateOptions{})
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not a size") {
			t.Errorf("create: %v; want Forbidden naming the annotation's error", err)
		}
	})

	// The webhook process gone: Ignore as deployed, then Fail as an
	// overlay would set it.
	wh.proc.stop()
	t.Run("webhook down, Ignore: stored without the sidecar", func(t *testing.T) {
		storedFailingOpen(t, c, hook, vllmPod, "vllm-webhook-down")
	})
	t.Run("webhook down, Fail: refused, its own namespace still served", func(t *testing.T) {
		for i := range mwc.Webhooks {
			mwc.Webhooks[i].FailurePolicy = ptr(admissionregistrationv1.Fail)
		}
		if _, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, mwc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "failurePolicy Fail in effect", c.apiserver, 2*time.Minute, func() error {
			if _, err := dryRunPod(t, c, vllmPod); err == nil {
				return fmt.Errorf("dry-run pod still accepted")
			}
			return nil
		})
		p := vllmPod.DeepCopy()
		p.Name = "vllm-webhook-down-fail"
		_, err := c.client.CoreV1().Pods("inference").Create(ctx, p, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
			t.Errorf("create with failurePolicy Fail and the webhook down: %v; want a refusal naming the webhook", err)
		}
		p.Namespace, p.Name = "tidepool-system", "webhook-comes-back"
		if hasSidecar(createPod(t, c, p)) {
			t.Errorf("a pod of tidepool-system was injected")
		}
	})
}

// storedFailingOpen creates a copy of pod named name and checks that it
// was stored without the sidecar after the API server's call to hook
// failed (failurePolicy Ignore): not merely skipped.
func storedFailingOpen(t *testing.T, c *cluster, hook string, pod *corev1.Pod, name string) {
	t.Helper()
	p := pod.DeepCopy()
	p.Name = name
	before := c.failedOpen(hook)
	if hasSidecar(createPod(t, c, p)) {
		t.Errorf("pod injected although the webhook cannot be reached")
	}
	if c.failedOpen(hook) == before {
		t.Errorf("the API server did not log the call to %s failing open", hook)
	}
}

// wantObjects checks that every object of a Kustomize directory is stored.
func wantObjects(t *testing.T, c *cluster, dir string, n int) {
	t.Helper()
	out, err := c.kubectl("get", "-k", dir, "-o", "name")
	if err != nil {
		t.Fatalf("kubectl get -k %s: %v\n%s", dir, err, out)
	}
	names := strings.Fields(out)
	if len(names) != n {
		t.Errorf("kubectl get -k %s: %d objects, want %d:\n%s", dir, len(names), n, out)
	}
}

func readObject(t *testing.T, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// lwsTemplates is what the test reads of a LeaderWorkerSet.
type lwsTemplates struct {
	Spec struct {
		LeaderWorkerTemplate struct {
			LeaderTemplate *corev1.PodTemplateSpec `json:"leaderTemplate"`
			WorkerTemplate *corev1.PodTemplateSpec `json:"workerTemplate"`
		} `json:"leaderWorkerTemplate"`
	} `json:"spec"`
}

// statefulSetPod is pod number i of a StatefulSet as its controller makes
// it: one volume per claim template, first, then the template's volumes.
func statefulSetPod(set *appsv1.StatefulSet, i int) *corev1.Pod {
	p := podFromTemplate(fmt.Sprintf("%s-%d", set.Name, i), &set.Spec.Template, set.Namespace)
	var vols []corev1.Volume
	for _, claim := range set.Spec.VolumeClaimTemplates {
		vols = append(vols, corev1.Volume{Name: claim.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: fmt.Sprintf("%s-%s", claim.Name, p.Name)}}})
	}
	p.Spec.Volumes = append(vols, p.Spec.Volumes...)
	p.Spec.Hostname, p.Spec.Subdomain = p.Name, set.Spec.ServiceName
	return p
}

// createPod creates a pod and returns it as stored (read back with GET).
func createPod(t *testing.T, c *cluster, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if p.Namespace == "" {
		p.Namespace = "inference"
	}
	if _, err := c.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	got, err := c.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return got
}

// dryRunPod creates a pod with dryRun=All: admission runs, nothing is
// stored; it returns the pod as it would have been stored.
func dryRunPod(t *testing.T, c *cluster, p *corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	p = p.DeepCopy()
	p.Name += "-dry-run"
	return c.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
}

func sidecarOf(p *corev1.Pod) *corev1.Container {
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == "tidepool" {
			return &p.Spec.InitContainers[i]
		}
	}
	return nil
}

func hasSidecar(p *corev1.Pod) bool { return sidecarOf(p) != nil }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }

func toYAML(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// injectCLI runs `tidepool inject` on a pod and returns its output.
func injectCLI(t *testing.T, tidepool string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	in := p.DeepCopy()
	in.APIVersion, in.Kind = "v1", "Pod"
	raw, err := yaml.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.Pod
	if err := yaml.UnmarshalStrict(runInject(t, tidepool, raw), &out); err != nil {
		t.Fatalf("tidepool inject output: %v", err)
	}
	return &out
}

// injectObject runs `tidepool inject` on a file of one object.
func injectObject(t *testing.T, tidepool, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(runInject(t, tidepool, raw), into); err != nil {
		t.Fatalf("tidepool inject %s: %v", path, err)
	}
}

func runInject(t *testing.T, tidepool string, in []byte) []byte {
	t.Helper()
	cmd := exec.Command(tidepool, "inject", "--image", testImage, "-")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tidepool inject: %v\n%s", err, stderr.String())
	}
	return out
}

// compareStored checks that a pod the webhook injected and one injected by
// `tidepool inject` were stored alike. The ServiceAccount admission
// plugin's token volume is left out: it runs before the webhooks, so it
// mounts the token in the CLI-injected sidecar but not in the
// webhook-injected one (the sidecar calls no API; docs/kubernetes.md).
func compareStored(t *testing.T, webhook, cli *corev1.Pod) {
	t.Helper()
	a, b := withoutToken(webhook.Spec), withoutToken(cli.Spec)
	if !equality.Semantic.DeepEqual(a, b) {
		t.Errorf("pod %s (webhook) and %s (tidepool inject) stored differently (-webhook +inject):\n%s", webhook.Name, cli.Name, diff.Diff(a, b))
	}
	for _, m := range []struct {
		what string
		a, b map[string]string
	}{{"labels", webhook.Labels, cli.Labels}, {"annotations", webhook.Annotations, cli.Annotations}} {
		if !equality.Semantic.DeepEqual(m.a, m.b) {
			t.Errorf("%s differ: webhook %v, inject %v", m.what, m.a, m.b)
		}
	}
}

// withoutToken is a pod spec without the projected ServiceAccount token
// volume (kube-api-access-<random>) and its mounts, and with the
// hostname (the pod's own name) cleared.
func withoutToken(s corev1.PodSpec) corev1.PodSpec {
	s = *s.DeepCopy()
	isToken := func(name string) bool { return strings.HasPrefix(name, "kube-api-access-") }
	var vols []corev1.Volume
	for _, v := range s.Volumes {
		if !isToken(v.Name) {
			vols = append(vols, v)
		}
	}
	s.Volumes = vols
	for _, cs := range [][]corev1.Container{s.InitContainers, s.Containers} {
		for i := range cs {
			var ms []corev1.VolumeMount
			for _, m := range cs[i].VolumeMounts {
				if !isToken(m.Name) {
					ms = append(ms, m)
				}
			}
			cs[i].VolumeMounts = ms
		}
	}
	s.Hostname = ""
	for i := range s.Volumes {
		if pvc := s.Volumes[i].PersistentVolumeClaim; pvc != nil {
			pvc.ClaimName = "" // named after the pod
		}
	}
	return s
}

// webhook is a running `tidepool webhook`.
type webhook struct {
	proc *process
	url  string
}

// startWebhook runs `tidepool webhook` on loopback with a serving
// certificate for 127.0.0.1 (and the Service's name, as cert-manager's
// would have) and waits for its /readyz.
func startWebhook(t *testing.T, c *cluster, tidepool string) *webhook {
	t.Helper()
	certDir := filepath.Join(c.dir, "webhook-tls")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	crt, key := c.ca.issue(t, "tidepool-webhook", nil, x509.ExtKeyUsageServerAuth,
		[]string{"tidepool-webhook.tidepool-system.svc"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	writeFile(t, filepath.Join(certDir, "tls.crt"), crt)
	writeFile(t, filepath.Join(certDir, "tls.key"), key)
	port, health := freePort(t), freePort(t)
	p := start(t, c.dir, "webhook", tidepool, "webhook",
		fmt.Sprintf("--addr=127.0.0.1:%d", port), fmt.Sprintf("--health-addr=127.0.0.1:%d", health),
		"--cert-dir="+certDir, "--image="+testImage)
	waitFor(t, "tidepool webhook", p, 2*time.Minute, func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	return &webhook{proc: p, url: fmt.Sprintf("https://127.0.0.1:%d/inject", port)}
}

// registerWebhook points deploy/'s stored MutatingWebhookConfiguration at
// the webhook's URL with the test CA, changing nothing else, and returns
// it as stored.
func registerWebhook(t *testing.T, c *cluster, url string) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	ctx := context.Background()
	api := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	mwc, err := api.Get(ctx, "tidepool-inject", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("deploy/'s MutatingWebhookConfiguration: %v", err)
	}
	var names []string
	for i := range mwc.Webhooks {
		if mwc.Webhooks[i].ClientConfig.Service == nil {
			t.Fatalf("webhook %s: clientConfig has no service", mwc.Webhooks[i].Name)
		}
		mwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: c.ca.certPEM}
		names = append(names, mwc.Webhooks[i].Name)
	}
	sort.Strings(names)
	if got := strings.Join(names, ","); got != "namespace.inject.tidepool.io,pod.inject.tidepool.io" {
		t.Fatalf("webhooks %s", got)
	}
	mwc, err = api.Update(ctx, mwc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update MutatingWebhookConfiguration: %v", err)
	}
	return mwc
}
