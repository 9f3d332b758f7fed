// Package admit serves the injection of package inject as a Kubernetes
// mutating admission webhook: AdmissionReview v1 in, a JSONPatch out, over
// controller-runtime's webhook server.
package admit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tidepool-kv/tidepool/inject"
)

// Path is where the webhook is served.
const Path = "/inject"

// ErrBadRequest reports an AdmissionReview the webhook cannot answer
// with a patch (another kind, no object, a malformed pod).
var ErrBadRequest = errors.New("admit: bad admission request")

// Handler injects the sidecar into the Pods of admission requests.
type Handler struct {
	cfg inject.Config
	lg  *zap.Logger
}

var _ admission.Handler = (*Handler)(nil)

// New validates cfg and returns a handler; lg nil means no logs.
func New(cfg inject.Config, lg *zap.Logger) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	return &Handler{cfg: cfg, lg: lg.Named("admit")}, nil
}

// Webhook wraps h for Register on a webhook server (at Path).
func (h *Handler) Webhook() *webhook.Admission { return &webhook.Admission{Handler: h} }

// Handle answers one request. A Pod create gets the patch that injects
// it (none when it is injected already or labelled
// tidepool.io/inject: "false"); a Pod the injector refuses (a bad
// annotation, a conflicting volume) is denied with the reason, naming
// the field; anything but a Pod is a bad request.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	lg := h.lg.With(zap.String("uid", string(req.UID)), zap.String("namespace", req.Namespace), zap.String("name", req.Name))
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" {
		lg.Warn("admission request for another kind", zap.String("kind", req.Kind.String()))
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("%w: kind %s/%s %s: only Pods are injected (register the webhook for pods only)",
			ErrBadRequest, req.Kind.Group, req.Kind.Version, req.Kind.Kind))
	}
	if req.Operation != admissionv1.Create {
		return admission.Allowed("tidepool injects pods on CREATE only")
	}
	if len(req.Object.Raw) == 0 {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("%w: request.object: empty", ErrBadRequest))
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("%w: request.object: not a Pod: %v", ErrBadRequest, err))
	}
	if err := h.cfg.Apply(&pod.ObjectMeta, &pod.Spec, "", nil); err != nil {
		name := pod.Name
		if name == "" {
			name = pod.GenerateName
		}
		lg.Info("pod refused", zap.Error(err))
		return admission.Denied(fmt.Sprintf("tidepool sidecar injection into pod %s/%s: %v", req.Namespace, name, err))
	}
	out, err := json.Marshal(&pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, out)
	lg.Debug("pod injected", zap.Int("operations", len(resp.Patches)))
	return resp
}
