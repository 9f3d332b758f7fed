package admit

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/tidepool-kv/tidepool/inject"
	"github.com/tidepool-kv/tidepool/internal/porttest"
)

func init() { log.SetLogger(logr.Discard()) }

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tidepool test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert, key, pool}
}

// issue writes a serving certificate for 127.0.0.1 into dir in
// cert-manager's layout (tls.crt, tls.key) and returns its serial.
func (ca *testCA) issue(t *testing.T, dir string, serial int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "tidepool-webhook.tidepool-system.svc"},
		DNSNames: []string{"tidepool-webhook.tidepool-system.svc"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// The key first, then the certificate: the watcher reloads on either.
	for _, f := range []struct {
		name string
		blk  *pem.Block
	}{{"tls.key", &pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}}, {"tls.crt", &pem.Block{Type: "CERTIFICATE", Bytes: der}}} {
		tmp := filepath.Join(dir, "."+f.name)
		if err := os.WriteFile(tmp, pem.EncodeToMemory(f.blk), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			t.Fatal(err)
		}
	}
}

// server runs the webhook over HTTPS on loopback for one test.
type server struct {
	url    string
	client *http.Client
	addr   string
	ca     *testCA
	dir    string
}

func startServer(t *testing.T) *server {
	t.Helper()
	ca := newCA(t)
	dir := t.TempDir()
	ca.issue(t, dir, 100)
	h, err := New(inject.DefaultConfig("test"), nil)
	if err != nil {
		t.Fatal(err)
	}
	port := porttest.Free(t)
	srv := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir})
	srv.Register(Path, h.Webhook())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	s := &server{
		url:    fmt.Sprintf("https://127.0.0.1:%d%s", port, Path),
		addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}}, Timeout: 10 * time.Second},
		ca:     ca, dir: dir,
	}
	deadline := time.Now().Add(10 * time.Second)
	for srv.StartedChecker()(nil) != nil {
		if time.Now().After(deadline) {
			t.Fatal("webhook server did not start")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	return s
}

// post sends body and decodes the AdmissionReview that comes back.
func (s *server) post(t *testing.T, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	resp, err := s.client.Post(s.url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var rev admissionv1.AdmissionReview
	if err := json.Unmarshal(raw, &rev); err != nil || rev.Response == nil {
		t.Fatalf("HTTP %d, not an AdmissionReview response (%v): %s", resp.StatusCode, err, raw)
	}
	// A well-formed request gets its own type back; controller-runtime
	// echoes whatever type a malformed one claimed (or none).
	if json.Valid(body) && bytes.Contains(body, []byte(`"kind":"AdmissionReview"`)) &&
		(rev.Kind != "AdmissionReview" || rev.APIVersion != "admission.k8s.io/v1") {
		t.Errorf("response type %s %s", rev.APIVersion, rev.Kind)
	}
	return rev.Response
}

func review(t *testing.T, uid string, kind metav1.GroupVersionKind, obj []byte) []byte {
	t.Helper()
	rev := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID(uid), Kind: kind, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "inference", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: obj},
		},
	}
	b, err := json.Marshal(rev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var podKind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}

// applyPatch applies a response's JSONPatch to the original object.
func applyPatch(t *testing.T, orig []byte, r *admissionv1.AdmissionResponse) []byte {
	t.Helper()
	if !r.Allowed {
		t.Fatalf("not allowed: %+v", r.Result)
	}
	if len(r.Patch) == 0 {
		return orig
	}
	if r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v", r.PatchType)
	}
	p, err := jsonpatch.DecodePatch(r.Patch)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(orig)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// injectFile runs `tidepool inject`'s mutation on a test input.
func injectFile(t *testing.T, name string) []byte {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "testdata", "in", name))
	if err != nil {
		t.Fatal(err)
	}
	out, err := inject.DefaultConfig("test").File(name, src)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func toJSON(t *testing.T, y []byte) []byte {
	t.Helper()
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func strictPod(t *testing.T, j []byte) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := yaml.UnmarshalStrict(j, &p); err != nil {
		t.Fatalf("strict decode: %v\n%s", err, j)
	}
	return &p
}

func samePod(t *testing.T, got, want *corev1.Pod) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := yaml.Marshal(got)
		w, _ := yaml.Marshal(want)
		t.Errorf("webhook result differs from tidepool inject:\n--- webhook\n%s\n--- inject\n%s", g, w)
	}
}

// podFromTemplate is the Pod a controller makes from a workload's template.
func podFromTemplate(tmpl corev1.PodTemplateSpec) *corev1.Pod {
	p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	p.GenerateName, p.Namespace = "vllm-7d9f-", "inference"
	return p
}

// The webhook's patch, applied to the original Pod, gives what
// `tidepool inject` gives, for a Pod and for a Deployment's pods.
func TestWebhookMatchesInject(t *testing.T) {
	s := startServer(t)

	t.Run("pod", func(t *testing.T) {
		src, err := os.ReadFile("../testdata/in/pod.yaml")
		if err != nil {
			t.Fatal(err)
		}
		orig := toJSON(t, src)
		r := s.post(t, review(t, "uid-1", podKind, orig))
		if r.UID != "uid-1" {
			t.Errorf("response uid %q", r.UID)
		}
		samePod(t, strictPod(t, applyPatch(t, orig, r)), strictPod(t, toJSON(t, injectFile(t, "pod.yaml"))))
	})

	t.Run("vllm deployment pod", func(t *testing.T) {
		src, err := os.ReadFile("../testdata/in/vllm.yaml")
		if err != nil {
			t.Fatal(err)
		}
		docs := strings.Split(string(src), "\n---\n")
		var d, injected appsv1.Deployment
		if err := yaml.Unmarshal([]byte(docs[1]), &d); err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(toJSON(t, []byte(strings.Split(string(injectFile(t, "vllm.yaml")), "\n---\n")[1])), &injected); err != nil {
			t.Fatal(err)
		}
		orig, err := json.Marshal(podFromTemplate(d.Spec.Template))
		if err != nil {
			t.Fatal(err)
		}
		r := s.post(t, review(t, "uid-2", podKind, orig))
		samePod(t, strictPod(t, applyPatch(t, orig, r)), podFromTemplate(injected.Spec.Template))

		// Injected already: allowed, nothing to patch.
		again := applyPatch(t, orig, r)
		r2 := s.post(t, review(t, "uid-3", podKind, again))
		if !r2.Allowed || len(r2.Patch) != 0 {
			t.Errorf("second admission: allowed %v, patch %s", r2.Allowed, r2.Patch)
		}
	})
}

func TestWebhookBadRequests(t *testing.T) {
	s := startServer(t)
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"e","image":"e"}]}}`)
	for _, tc := range []struct {
		name string
		body []byte
		code int32
		msg  string
	}{
		{"wrong kind", review(t, "u1", metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, pod), 400, "only Pods are injected"},
		{"malformed JSON", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{`), 400, ""},
		{"not an AdmissionReview", []byte(`{"apiVersion":"v1","kind":"Pod"}`), 400, ""},
		{"object not a pod", review(t, "u2", podKind, []byte(`{"spec":{"containers":"nope"}}`)), 400, "request.object: not a Pod"},
		{"no object", review(t, "u3", podKind, nil), 400, "request.object: empty"},
		{"oversized body", append(append([]byte(`{"x":"`), bytes.Repeat([]byte("a"), 8<<20)...), '"', '}'), 413, "too large"},
		{"bad annotation", review(t, "u4", podKind, []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"tidepool.io/dram-capacity":"lots"}},"spec":{"containers":[{"name":"e","image":"e"}]}}`)),
			403, `metadata.annotations["tidepool.io/dram-capacity"]`},
		{"conflicting volume", review(t, "u5", podKind, []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"e","image":"e"}],"volumes":[{"name":"tidepool-socket","hostPath":{"path":"/x"}}]}}`)),
			403, "spec.volumes[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.post(t, tc.body)
			if r.Allowed {
				t.Fatalf("allowed: %+v", r)
			}
			if len(r.Patch) != 0 {
				t.Errorf("a refused request got a patch: %s", r.Patch)
			}
			if r.Result == nil || r.Result.Code != tc.code || !strings.Contains(r.Result.Message, tc.msg) {
				t.Errorf("result %+v: want code %d with %q", r.Result, tc.code, tc.msg)
			}
		})
	}
}

// The server picks up a renewed certificate (cert-manager rewrites the
// files of the mounted Secret) without a restart.
func TestWebhookReloadsCertificate(t *testing.T) {
	s := startServer(t)
	serial := func() (int64, error) {
		c, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: s.ca.pool, ServerName: "127.0.0.1"})
		if err != nil {
			return 0, err
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
	}
	if n, err := serial(); err != nil || n != 100 {
		t.Fatalf("serial %d, %v", n, err)
	}
	s.ca.issue(t, s.dir, 101)
	deadline := time.Now().Add(20 * time.Second) // fsnotify, else the watcher's 10s poll
	for {
		n, err := serial()
		if err == nil && n == 101 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still serving serial %d (%v) after the files changed", n, err)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
	// And it still answers admission requests.
	r := s.post(t, review(t, "u", podKind, []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"e","image":"e"}]}}`)))
	if !r.Allowed || len(r.Patch) == 0 {
		t.Fatalf("after reload: %+v", r)
	}
}
