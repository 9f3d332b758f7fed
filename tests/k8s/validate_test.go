// Package k8s checks tidepool's injected pods against Kubernetes itself, at
// the version this module pins (go.mod): its own defaulting and create-time
// validation, and (apiserver_test.go, with `make test-k8s`) a real
// kube-apiserver that calls `tidepool webhook` and stores what it returns.
//
// It is a module of its own so that tidepool's module does not take on
// k8s.io/kubernetes, which is not meant to be imported and whose go.mod
// needs a replace line for each of its staging modules.
package k8s

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/warning"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/apps"
	_ "k8s.io/kubernetes/pkg/apis/apps/install" // apps/v1 defaults and conversions
	api "k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install" // core/v1 defaults and conversions
	"k8s.io/kubernetes/pkg/registry/apps/deployment"
	"k8s.io/kubernetes/pkg/registry/apps/statefulset"
	"k8s.io/kubernetes/pkg/registry/core/pod"
	"k8s.io/kubernetes/pkg/registry/core/podtemplate"
	"sigs.k8s.io/yaml"
)

// goldenDir holds `tidepool inject`'s outputs (inject/inject_test.go keeps
// them equal to what the injector writes).
const goldenDir = "../../inject/testdata/golden"

// warnings collects what a create would send back as Warning headers.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) AddWarning(agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

// create runs what kube-apiserver's registry does to a versioned object on
// CREATE before storing it, minus admission: the scheme's defaulting,
// conversion to the internal type, the resource's strategy
// (PrepareForCreate, Validate, declarative validation, object-meta
// validation, WarningsOnCreate, Canonicalize) through rest.BeforeCreate.
// It returns the internal object, the field errors (an *errors.StatusError
// of reason Invalid) and the warnings.
func create(strategy rest.RESTCreateStrategy, resource schema.GroupVersionResource, versioned, internal runtime.Object, namespace string) (runtime.Object, error, []string) {
	legacyscheme.Scheme.Default(versioned)
	if err := legacyscheme.Scheme.Convert(versioned, internal, nil); err != nil {
		return nil, fmt.Errorf("convert %T: %w", versioned, err), nil
	}
	meta, err := metaOf(internal)
	if err != nil {
		return nil, err, nil
	}
	rest.FillObjectMetaSystemFields(meta)
	var w warnings
	ctx := genericapirequest.WithNamespace(context.Background(), namespace)
	prefix := "apis"
	if resource.Group == "" {
		prefix = "api"
	}
	ctx = genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{
		IsResourceRequest: true, Verb: "create", APIPrefix: prefix, APIGroup: resource.Group, APIVersion: resource.Version,
		Namespace: namespace, Resource: resource.Resource, Name: meta.GetName(),
	})
	ctx = warning.WithWarningRecorder(ctx, &w)
	err = rest.BeforeCreate(strategy, ctx, internal)
	return internal, err, w.msgs
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object meta", obj)
	}
	return m, nil
}

// podFromTemplate is the pod a workload controller creates from a
// template: what the webhook is sent.
func podFromTemplate(owner string, t *corev1.PodTemplateSpec, namespace string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: *t.ObjectMeta.DeepCopy(), Spec: *t.Spec.DeepCopy()}
	p.Name = owner + "-0"
	p.Namespace = namespace
	return p
}

// document is one YAML document of a golden file, with what it checks as.
type document struct {
	name      string // file#index kind/name
	kind      string
	raw       []byte
	templates map[string]*corev1.PodTemplateSpec // path in the object -> template
}

// documents splits a multi-document YAML file and finds the pod templates
// of each document by kind; a kind with no pod is passed through.
func documents(t *testing.T, path string) []document {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(src)))
	var out []document
	for i := 1; ; i++ {
		raw, err := r.Read()
		if err != nil {
			break
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(raw, &head); err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		d := document{name: fmt.Sprintf("%s#%d %s/%s", filepath.Base(path), i, head.Kind, head.Metadata.Name), kind: head.Kind, raw: raw,
			templates: map[string]*corev1.PodTemplateSpec{}}
		switch head.Kind {
		case "Pod":
			var p corev1.Pod
			strict(t, d.name, raw, &p)
			d.templates["pod"] = &corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
		case "Deployment":
			var o appsv1.Deployment
			strict(t, d.name, raw, &o)
			d.templates["spec.template"] = &o.Spec.Template
		case "StatefulSet":
			// With the volume per claim template its controller adds to
			// each pod (statefulSetPod).
			var o appsv1.StatefulSet
			strict(t, d.name, raw, &o)
			p := statefulSetPod(&o, 0)
			d.templates["spec.template"] = &corev1.PodTemplateSpec{ObjectMeta: o.Spec.Template.ObjectMeta, Spec: p.Spec}
		case "LeaderWorkerSet":
			// leaderworkerset.x-k8s.io is not part of Kubernetes: its pod
			// templates are checked as core PodTemplates and Pods.
			var o lwsTemplates
			if err := yaml.Unmarshal(raw, &o); err != nil {
				t.Fatalf("%s: %v", d.name, err)
			}
			if l := o.Spec.LeaderWorkerTemplate.LeaderTemplate; l != nil {
				d.templates["spec.leaderWorkerTemplate.leaderTemplate"] = l
			}
			if w := o.Spec.LeaderWorkerTemplate.WorkerTemplate; w != nil {
				d.templates["spec.leaderWorkerTemplate.workerTemplate"] = w
			}
		}
		out = append(out, d)
	}
	return out
}

func strict(t *testing.T, name string, raw []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(raw, into); err != nil {
		t.Fatalf("%s: strict decode: %v", name, err)
	}
}

// fieldErrors returns the field errors of a create's error, or the error
// itself when it is of another kind.
func fieldErrors(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	if se, ok := err.(interface{ Status() metav1.Status }); ok {
		if d := se.Status().Details; d != nil && len(d.Causes) > 0 {
			for _, c := range d.Causes {
				out = append(out, c.Field+": "+c.Message)
			}
			return out
		}
	}
	return []string{err.Error()}
}

// checkCreate runs create and fails the test on any field error.
func checkCreate(t *testing.T, what string, strategy rest.RESTCreateStrategy, resource schema.GroupVersionResource, versioned, internal runtime.Object, namespace string) runtime.Object {
	t.Helper()
	obj, err, warns := create(strategy, resource, versioned, internal, namespace)
	for _, w := range warns {
		t.Logf("%s: warning: %s", what, w)
	}
	if err != nil {
		t.Errorf("%s: refused by Kubernetes' validation:\n  %s", what, strings.Join(fieldErrors(err), "\n  "))
	}
	return obj
}

// TestGoldensValidate runs every injected golden pod, workload and pod
// template through the pinned Kubernetes' create path: a Pod as a Pod;
// a Deployment and a StatefulSet as themselves (their validation covers
// the template), and each template as a core PodTemplate and as the Pod a
// controller makes of it; a LeaderWorkerSet's leader and worker templates
// as PodTemplates and Pods.
func TestGoldensValidate(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.yaml"))
	if err != nil || len(files) < 7 {
		t.Fatalf("golden files: %v %v", files, err)
	}
	const ns = "inference"
	checked := 0
	for _, f := range files {
		for _, d := range documents(t, f) {
			t.Run(d.name, func(t *testing.T) {
				switch d.kind {
				case "Deployment":
					var o appsv1.Deployment
					strict(t, d.name, d.raw, &o)
					o.Namespace = ns
					checkCreate(t, "Deployment", deployment.Strategy, appsv1.SchemeGroupVersion.WithResource("deployments"), &o, &apps.Deployment{}, ns)
				case "StatefulSet":
					var o appsv1.StatefulSet
					strict(t, d.name, d.raw, &o)
					o.Namespace = ns
					checkCreate(t, "StatefulSet", statefulset.Strategy, appsv1.SchemeGroupVersion.WithResource("statefulsets"), &o, &apps.StatefulSet{}, ns)
				}
				if len(d.templates) == 0 {
					t.Logf("%s: no pod template", d.kind)
					return
				}
				for path, tmpl := range d.templates {
					if path != "pod" {
						pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: ns}, Template: *tmpl.DeepCopy()}
						checkCreate(t, path+" as a PodTemplate", podtemplate.Strategy, corev1.SchemeGroupVersion.WithResource("podtemplates"), pt, &api.PodTemplate{}, ns)
					}
					p := podFromTemplate("golden", tmpl, ns)
					obj := checkCreate(t, path+" as a Pod", pod.Strategy, corev1.SchemeGroupVersion.WithResource("pods"), p, &api.Pod{}, ns)
					if ip, ok := obj.(*api.Pod); ok && !t.Failed() {
						checkSidecar(t, path, ip)
					}
					checked++
				}
			})
		}
	}
	if checked < 8 {
		t.Errorf("only %d pod templates checked", checked)
	}
}

// checkSidecar checks that the validated pod still has the native sidecar:
// validation passes a pod through, but defaulting must not have dropped it.
func checkSidecar(t *testing.T, path string, p *api.Pod) {
	t.Helper()
	for _, c := range p.Spec.InitContainers {
		if c.Name == "tidepool" {
			if c.RestartPolicy == nil || *c.RestartPolicy != api.ContainerRestartPolicyAlways {
				t.Errorf("%s: sidecar restartPolicy %v after defaulting", path, c.RestartPolicy)
			}
			return
		}
	}
	t.Errorf("%s: no tidepool init container after the create path", path)
}

// TestValidationRefuses is the negative control: the same create path
// refuses a golden pod broken the way an injector could break it, so
// TestGoldensValidate passing means something.
func TestValidationRefuses(t *testing.T) {
	docs := documents(t, filepath.Join(goldenDir, "pod.yaml"))
	tmpl := docs[0].templates["pod"]
	if tmpl == nil {
		t.Fatal("pod.yaml: no Pod")
	}
	for _, tc := range []struct {
		name   string
		mutate func(*corev1.PodSpec)
		field  string
	}{
		{"a sidecar restartPolicy Kubernetes does not have", func(s *corev1.PodSpec) {
			bad := corev1.ContainerRestartPolicy("Sometimes")
			s.InitContainers[len(s.InitContainers)-1].RestartPolicy = &bad
		}, "spec.initContainers"},
		{"a mount of a volume that is not there", func(s *corev1.PodSpec) {
			s.Containers[0].VolumeMounts = append(s.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "tidepool-missing", MountPath: "/x"})
		}, "spec.containers[0].volumeMounts"},
		{"two volumes of one name", func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, s.Volumes[len(s.Volumes)-1])
		}, "spec.volumes"},
		{"a sidecar port name used twice", func(s *corev1.PodSpec) {
			sc := &s.InitContainers[len(s.InitContainers)-1]
			sc.Ports = append(sc.Ports, corev1.ContainerPort{Name: sc.Ports[0].Name, ContainerPort: 1})
		}, "spec.initContainers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := podFromTemplate("bad", tmpl, "inference")
			tc.mutate(&p.Spec)
			_, err, _ := create(pod.Strategy, corev1.SchemeGroupVersion.WithResource("pods"), p, &api.Pod{}, "inference")
			errs := fieldErrors(err)
			if len(errs) == 0 {
				t.Fatal("accepted")
			}
			found := false
			for _, e := range errs {
				found = found || strings.HasPrefix(e, tc.field)
			}
			if !found {
				t.Errorf("errors %q name no field under %s", errs, tc.field)
			}
		})
	}
}
