package inject

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// certificate and issuer mirror the fields of cert-manager.io/v1 that
// deploy/ uses, with cert-manager's JSON names (the cert-manager module
// would bring a whole controller's dependencies for two structs); strict
// decoding refuses any field they do not have.
type certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName  string           `json:"secretName"`
		DNSNames    []string         `json:"dnsNames"`
		Duration    *metav1.Duration `json:"duration,omitempty"`
		RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind,omitempty"`
			Group string `json:"group,omitempty"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

type issuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SelfSigned *struct {
			CRLDistributionPoints []string `json:"crlDistributionPoints,omitempty"`
		} `json:"selfSigned,omitempty"`
	} `json:"spec"`
}

var deployKinds = map[string]func() any{
	"MutatingWebhookConfiguration": func() any { return &admissionregistrationv1.MutatingWebhookConfiguration{} },
	"PodMonitor":                   func() any { return &monitoringv1.PodMonitor{} },
	"Certificate":                  func() any { return &certificate{} },
	"Issuer":                       func() any { return &issuer{} },
}

// kustomization is all deploy/'s kustomization files may say: plain
// resources, so that rendering them is reading them in order.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

// render reads a Kustomize directory as `kubectl kustomize` renders one
// made of plain resources.
func render(t *testing.T, dir string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v (only apiVersion, kind and resources are rendered here)", dir, err)
	}
	if k.Kind != "Kustomization" || k.APIVersion != "kustomize.config.k8s.io/v1beta1" || len(k.Resources) == 0 {
		t.Fatalf("%s/kustomization.yaml: %+v", dir, k)
	}
	var out []byte
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			out = append(out, render(t, p)...)
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(append(out, "\n---\n"...), b...), '\n')
	}
	return out
}

// Every manifest in deploy/ is listed by its kustomization, decodes
// strictly into its type, and fits the others (names, ports, labels).
func TestDeployManifests(t *testing.T) {
	base := render(t, "../deploy")
	examples := render(t, "../deploy/examples")
	// Every YAML file is rendered by one of the two.
	files, _ := filepath.Glob("../deploy/*.yaml")
	ex, _ := filepath.Glob("../deploy/examples/*.yaml")
	for _, f := range append(files, ex...) {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		b, _ := os.ReadFile(f)
		if !strings.Contains(string(base)+string(examples), string(b)) {
			t.Errorf("%s is in no kustomization.yaml", f)
		}
	}
	objs, err := decodeStrict(base, deployKinds)
	if err != nil {
		t.Fatalf("deploy/: %v", err)
	}
	exObjs, err := decodeStrict(examples, deployKinds)
	if err != nil {
		t.Fatalf("deploy/examples: %v", err)
	}

	var (
		dep   *appsv1.Deployment
		svc   *corev1.Service
		mwc   *admissionregistrationv1.MutatingWebhookConfiguration
		cert  *certificate
		iss   *issuer
		pm    *monitoringv1.PodMonitor
		sa    *corev1.ServiceAccount
		peers *corev1.Service
		vllm  *appsv1.Deployment
	)
	for _, o := range objs {
		switch x := o.(type) {
		case *appsv1.Deployment:
			dep = x
		case *corev1.Service:
			svc = x
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			mwc = x
		case *certificate:
			cert = x
		case *issuer:
			iss = x
		case *monitoringv1.PodMonitor:
			pm = x
		case *corev1.ServiceAccount:
			sa = x
		}
	}
	for _, o := range exObjs {
		switch x := o.(type) {
		case *corev1.Service:
			peers = x
		case *appsv1.Deployment:
			vllm = x
		}
	}
	if dep == nil || svc == nil || mwc == nil || cert == nil || iss == nil || pm == nil || sa == nil || peers == nil || vllm == nil {
		t.Fatalf("missing objects: deployment %v service %v webhook config %v certificate %v issuer %v podmonitor %v serviceaccount %v peers %v vllm %v",
			dep != nil, svc != nil, mwc != nil, cert != nil, iss != nil, pm != nil, sa != nil, peers != nil, vllm != nil)
	}

	// The webhook: its Service, its certificate, its configuration.
	wc := dep.Spec.Template.Spec.Containers[0]
	if dep.Spec.Template.Spec.ServiceAccountName != sa.Name || !slices.Contains(wc.Args, "webhook") {
		t.Errorf("webhook deployment: service account %q, args %q", dep.Spec.Template.Spec.ServiceAccountName, wc.Args)
	}
	if svc.Spec.Ports[0].TargetPort.StrVal != wc.Ports[0].Name || svc.Spec.Selector["app.kubernetes.io/name"] != dep.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Errorf("webhook service %+v does not reach the deployment's port %+v", svc.Spec, wc.Ports[0])
	}
	var tlsSecret string
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			tlsSecret = v.Secret.SecretName
		}
	}
	if cert.Spec.SecretName != tlsSecret || cert.Spec.IssuerRef.Name != iss.Name || !slices.Contains(cert.Spec.DNSNames, svc.Name+"."+svc.Namespace+".svc") {
		t.Errorf("certificate %+v: secret %q, issuer %q, service %s.%s", cert.Spec, tlsSecret, iss.Name, svc.Name, svc.Namespace)
	}
	if got := mwc.Annotations["cert-manager.io/inject-ca-from"]; got != cert.Namespace+"/"+cert.Name {
		t.Errorf("inject-ca-from %q", got)
	}
	if len(mwc.Webhooks) != 2 {
		t.Fatalf("%d webhooks", len(mwc.Webhooks))
	}
	for _, w := range mwc.Webhooks {
		s := w.ClientConfig.Service
		if s == nil || s.Name != svc.Name || s.Namespace != svc.Namespace || s.Path == nil || *s.Path != "/inject" || *s.Port != svc.Spec.Ports[0].Port {
			t.Errorf("%s: client config %+v", w.Name, w.ClientConfig)
		}
		if *w.FailurePolicy != admissionregistrationv1.Ignore || *w.SideEffects != admissionregistrationv1.SideEffectClassNone ||
			!slices.Equal(w.AdmissionReviewVersions, []string{"v1"}) || w.Rules[0].Resources[0] != "pods" {
			t.Errorf("%s: %+v", w.Name, w)
		}
	}

	// Sidecars: the peers' Service and the PodMonitor select injected pods.
	if peers.Spec.ClusterIP != corev1.ClusterIPNone || !peers.Spec.PublishNotReadyAddresses || peers.Spec.Selector[LabelMember] != "true" {
		t.Errorf("peers service %+v", peers.Spec)
	}
	if peers.Name+"."+peers.Namespace+".svc" != strings.ReplaceAll(DefaultConfig("x").Join, "$(POD_NAMESPACE)", peers.Namespace) {
		t.Errorf("peers service %s.%s is not the sidecars' default join name %s", peers.Name, peers.Namespace, DefaultConfig("x").Join)
	}
	if pm.Spec.Selector.MatchLabels[LabelMember] != "true" || pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != "metrics" {
		t.Errorf("podmonitor %+v", pm.Spec)
	}

	// The example engine gets the sidecar, and the result is valid.
	src, err := os.ReadFile("../deploy/examples/vllm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := DefaultConfig("test").File("vllm.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	injected, err := decodeStrict(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &injected[0].(*appsv1.Deployment).Spec.Template
	checkInjected(t, tmpl)
	for _, c := range tmpl.Spec.InitContainers {
		if c.Name == ContainerName && !slices.Contains(c.Args, "--dram-capacity=32GiB") {
			t.Errorf("example's annotation not applied: %q", c.Args)
		}
	}
}

// The strict decoding above refuses what it should: an unknown field, in
// a built-in type, a custom resource and a mirrored one.
func TestDecodeStrictRefusesUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 2}\n",
		"apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x}\nspec: {selectr: {}}\n",
		"apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: x}\nspec: {secretName: s, dnsName: [a]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: a, restartPolicy: Always, bogus: 1}]}\n",
	} {
		if _, err := decodeStrict([]byte(doc), deployKinds); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%q: %v", doc, err)
		}
	}
}
