package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
)

// MaxFileSize bounds one input of File (64 MiB): manifests are small, and
// the whole input is held in memory so that nothing is half-written.
const MaxFileSize = 64 << 20

// templatePaths lists, per kind, the fields holding pod templates; the
// first is required. Kinds not listed pass through unchanged.
var templatePaths = map[string][][]string{
	"Deployment":            {{"spec", "template"}},
	"StatefulSet":           {{"spec", "template"}},
	"DaemonSet":             {{"spec", "template"}},
	"ReplicaSet":            {{"spec", "template"}},
	"ReplicationController": {{"spec", "template"}},
	"Job":                   {{"spec", "template"}},
	"CronJob":               {{"spec", "jobTemplate", "spec", "template"}},
	"LeaderWorkerSet": {
		{"spec", "leaderWorkerTemplate", "workerTemplate"},
		{"spec", "leaderWorkerTemplate", "leaderTemplate"},
	},
}

// File adds the sidecar to every pod template in src, a stream of YAML
// documents, and returns the new stream. name names the input in errors.
// Objects that hold no pods (Services, ConfigMaps) pass through; fields
// the mutation does not touch keep their order, style and comments.
// When nothing changes, src is returned as it is. On any error nothing
// is returned: an error names the document, the object and the field.
func (c Config) File(name string, src []byte) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(src) > MaxFileSize {
		return nil, fmt.Errorf("%w: %s: larger than %d bytes", ErrInvalid, name, MaxFileSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var docs []*yaml.Node
	changed := false
	for i := 1; ; i++ {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: document %d: malformed YAML: %v", ErrInvalid, name, i, err)
		}
		ch, err := c.document(&doc)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d%s: %w", name, i, describeDoc(&doc), err)
		}
		changed = changed || ch
		docs = append(docs, &doc)
	}
	if !changed {
		return src, nil
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	for _, d := range docs {
		if err := enc.Encode(d); err != nil {
			return nil, fmt.Errorf("inject: %s: encode: %w", name, err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("inject: %s: encode: %w", name, err)
	}
	return out.Bytes(), nil
}

// describeDoc names a document's object: ` (Deployment "vllm")`.
func describeDoc(doc *yaml.Node) string {
	if len(doc.Content) == 0 {
		return ""
	}
	root := doc.Content[0]
	kind := scalar(lookup(root, "kind"))
	name := scalar(lookup(lookup(root, "metadata"), "name"))
	if kind == "" {
		return ""
	}
	return fmt.Sprintf(" (%s %q)", kind, name)
}

// document injects one document in place; it reports whether it changed.
func (c Config) document(doc *yaml.Node) (bool, error) {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return false, nil
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return false, nil // an empty document
	}
	if root.Kind != yaml.MappingNode {
		return false, fmt.Errorf("%w: not a Kubernetes object (a mapping with apiVersion and kind)", ErrInvalid)
	}
	kind := scalar(lookup(root, "kind"))
	if kind == "" || scalar(lookup(root, "apiVersion")) == "" {
		return false, fmt.Errorf("%w: apiVersion, kind: missing; not a Kubernetes object", ErrInvalid)
	}
	switch kind {
	case "List", "PodList", "DeploymentList", "StatefulSetList":
		return false, fmt.Errorf("%w: kind: %s is not supported; give its items as separate documents (---)", ErrInvalid, kind)
	case "Pod":
		var pod corev1.Pod
		if err := decodeNode(root, &pod); err != nil {
			return false, err
		}
		orig := pod.DeepCopy()
		if err := c.Apply(&pod.ObjectMeta, &pod.Spec, "", nil); err != nil {
			return false, err
		}
		return mergeTyped(root, orig, &pod)
	case "PodTemplate":
		return false, fmt.Errorf("%w: kind: PodTemplate is not supported; inject the workload that uses it", ErrInvalid)
	}
	paths, ok := templatePaths[kind]
	if !ok {
		return false, nil
	}
	var claims []string
	if kind == "StatefulSet" {
		if vct := lookup(lookup(root, "spec"), "volumeClaimTemplates"); vct != nil && vct.Kind == yaml.SequenceNode {
			for _, e := range vct.Content {
				claims = append(claims, scalar(lookup(lookup(e, "metadata"), "name")))
			}
		}
	}
	changed := false
	for i, p := range paths {
		at := joinPath(p)
		n := root
		for _, k := range p {
			n = lookup(n, k)
		}
		if n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			if i == 0 {
				return false, fmt.Errorf("%w: %s: missing; a %s needs a pod template", ErrInvalid, at, kind)
			}
			continue
		}
		if n.Kind != yaml.MappingNode {
			return false, fmt.Errorf("%w: %s: not a pod template (a mapping with metadata and spec)", ErrInvalid, at)
		}
		if lookup(n, "spec") == nil {
			return false, fmt.Errorf("%w: %s.spec: missing; a pod template needs a spec with containers", ErrInvalid, at)
		}
		var tmpl corev1.PodTemplateSpec
		if err := decodeNode(n, &tmpl); err != nil {
			return false, fmt.Errorf("%s: %w", at, err)
		}
		orig := tmpl.DeepCopy()
		if err := c.Apply(&tmpl.ObjectMeta, &tmpl.Spec, at, claims); err != nil {
			return false, err
		}
		ch, err := mergeTyped(n, orig, &tmpl)
		if err != nil {
			return false, err
		}
		changed = changed || ch
	}
	return changed, nil
}

func joinPath(p []string) string {
	s := ""
	for i, k := range p {
		if i > 0 {
			s += "."
		}
		s += k
	}
	return s
}

// decodeNode decodes a YAML mapping into a Kubernetes type through JSON,
// as the API server would (unknown fields are kept in the YAML, untouched).
func decodeNode(n *yaml.Node, into any) error {
	var v any
	if err := n.Decode(&v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%w: %v (keys must be strings)", ErrInvalid, err)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

// mergeTyped writes into n what changed between the typed objects before
// and after injection, leaving everything else in n as it was.
func mergeTyped(n *yaml.Node, before, after any) (bool, error) {
	b, err := json.Marshal(before)
	if err != nil {
		return false, err
	}
	a, err := json.Marshal(after)
	if err != nil {
		return false, err
	}
	if bytes.Equal(a, b) {
		return false, nil
	}
	ov, err := decodeOrdered(b)
	if err != nil {
		return false, err
	}
	nv, err := decodeOrdered(a)
	if err != nil {
		return false, err
	}
	merge(n, ov, nv)
	return true, nil
}

// omap is a JSON object that keeps its keys' order.
type omap struct {
	keys []string
	vals map[string]any
}

func decodeOrdered(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	return decodeValue(d)
}

func decodeValue(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := &omap{vals: map[string]any{}}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				m.keys = append(m.keys, k)
				m.vals[k] = v
			}
			_, err := d.Token()
			return m, err
		case '[':
			l := []any{}
			for d.More() {
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			_, err := d.Token()
			return l, err
		}
		return nil, fmt.Errorf("inject: unexpected %v", t)
	default:
		return t, nil
	}
}

// merge changes node n (whose content decodes to old) to hold new. Maps
// are merged key by key (new keys appended, in new's order), lists whose
// existing elements keep their place (and name) element by element;
// anything else is replaced, keeping the node's comments.
func merge(n *yaml.Node, old, new any) {
	if reflect.DeepEqual(old, new) {
		return
	}
	if om, ok := old.(*omap); ok && n.Kind == yaml.MappingNode {
		if nm, ok := new.(*omap); ok {
			for _, k := range om.keys {
				if _, keep := nm.vals[k]; !keep {
					removeKey(n, k)
				}
			}
			for j, k := range nm.keys {
				nv := nm.vals[k]
				ov, had := om.vals[k]
				if had && reflect.DeepEqual(ov, nv) {
					continue
				}
				child := lookup(n, k)
				switch {
				case child == nil:
					if nv == nil {
						continue
					}
					insertKey(n, k, build(nv), nm.keys[j+1:])
				case !had:
					replace(child, nv)
				default:
					merge(child, ov, nv)
				}
			}
			return
		}
	}
	if ol, ok := old.([]any); ok && n.Kind == yaml.SequenceNode && len(n.Content) == len(ol) {
		if nl, ok := new.([]any); ok && len(nl) >= len(ol) && sameNames(ol, nl[:len(ol)]) {
			for i := range ol {
				merge(n.Content[i], ol[i], nl[i])
			}
			for _, v := range nl[len(ol):] {
				n.Content = append(n.Content, build(v))
			}
			return
		}
	}
	replace(n, new)
}

// sameNames reports whether two lists name their elements alike, place
// by place (elements without a name match by place).
func sameNames(a, b []any) bool {
	for i := range a {
		am, ok1 := a[i].(*omap)
		bm, ok2 := b[i].(*omap)
		if ok1 && ok2 && am.vals["name"] != bm.vals["name"] {
			return false
		}
	}
	return true
}

func replace(n *yaml.Node, v any) {
	b := build(v)
	b.HeadComment, b.LineComment, b.FootComment = n.HeadComment, n.LineComment, n.FootComment
	*n = *b
}

// build makes a YAML node of a JSON value, leaving out null fields.
func build(v any) *yaml.Node {
	switch t := v.(type) {
	case *omap:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for _, k := range t.keys {
			if t.vals[k] == nil {
				continue
			}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, build(t.vals[k]))
		}
		return n
	case []any:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, e := range t {
			n.Content = append(n.Content, build(e))
		}
		return n
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return scalarNode(i)
		}
		f, _ := strconv.ParseFloat(string(t), 64)
		return scalarNode(f)
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
	default:
		return scalarNode(t)
	}
}

func scalarNode(v any) *yaml.Node {
	var n yaml.Node
	if err := n.Encode(v); err != nil {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: fmt.Sprint(v)}
	}
	return &n
}

// lookup returns the value node of key k in mapping n (nil if none).
func lookup(n *yaml.Node, k string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == k {
			return n.Content[i+1]
		}
	}
	return nil
}

// insertKey adds k: v to mapping n before the first of the keys after
// it (in the typed object's order) that n has, else at the end, so that
// a new field lands where Kubernetes would print it.
func insertKey(n *yaml.Node, k string, v *yaml.Node, after []string) {
	kv := []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, v}
	for _, a := range after {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == a {
				n.Content = append(n.Content[:i], append(kv, n.Content[i:]...)...)
				return
			}
		}
	}
	n.Content = append(n.Content, kv...)
}

func removeKey(n *yaml.Node, k string) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == k {
			n.Content = append(n.Content[:i], n.Content[i+2:]...)
			return
		}
	}
}

func scalar(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}
