package inject

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// leaderWorkerSet mirrors the fields of leaderworkerset.x-k8s.io/v1 that
// the test inputs use (sigs.k8s.io/lws would bring a controller's
// dependencies for one struct); its pod templates are the real type.
type leaderWorkerSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Replicas             *int32 `json:"replicas,omitempty"`
		LeaderWorkerTemplate struct {
			Size           *int32                  `json:"size,omitempty"`
			RestartPolicy  string                  `json:"restartPolicy,omitempty"`
			LeaderTemplate *corev1.PodTemplateSpec `json:"leaderTemplate,omitempty"`
			WorkerTemplate corev1.PodTemplateSpec  `json:"workerTemplate"`
		} `json:"leaderWorkerTemplate"`
	} `json:"spec"`
}

// typedFor returns a new object of a document's kind, for strict decoding.
// extra maps further kinds (the deploy/ manifests' custom resources).
func typedFor(kind string, extra map[string]func() any) (any, error) {
	switch kind {
	case "Pod":
		return &corev1.Pod{}, nil
	case "Service":
		return &corev1.Service{}, nil
	case "Secret":
		return &corev1.Secret{}, nil
	case "ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "Namespace":
		return &corev1.Namespace{}, nil
	case "ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "Deployment":
		return &appsv1.Deployment{}, nil
	case "StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "Job":
		return &batchv1.Job{}, nil
	case "CronJob":
		return &batchv1.CronJob{}, nil
	case "LeaderWorkerSet":
		return &leaderWorkerSet{}, nil
	}
	if f, ok := extra[kind]; ok {
		return f(), nil
	}
	return nil, fmt.Errorf("no type for kind %q", kind)
}

// decodeStrict splits a YAML stream and decodes every document strictly
// (unknown or duplicate fields are errors) into its Kubernetes type.
func decodeStrict(stream []byte, extra map[string]func() any) ([]any, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var objs []any
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 || isComments(doc) {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		obj, err := typedFor(tm.Kind, extra)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
}

func isComments(doc []byte) bool {
	for _, l := range bytes.Split(doc, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' {
			return false
		}
	}
	return true
}
