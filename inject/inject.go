package inject

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Apply adds the sidecar to one pod template: meta and spec are changed
// in place, and only when it succeeds (on an error they are left as they
// were). at is the template's field path in its object ("spec.template",
// or "" for a Pod), used in errors; claims are the names of a
// StatefulSet's volumeClaimTemplates, which may hold the SSD tier.
// Applying it to its own output changes nothing. A pod labelled
// tidepool.io/inject: "false" is left alone. The engine containers, which
// get the socket and the arenas, are those of tidepool.io/containers,
// else kubectl's default container, else the first container that is not
// a mesh proxy (istio-proxy, linkerd-proxy, daprd).
func (c Config) Apply(meta *metav1.ObjectMeta, spec *corev1.PodSpec, at string, claims []string) error {
	if meta.Labels[LabelInject] == "false" {
		return nil
	}
	pre := at
	if pre != "" {
		pre += "."
	}
	cfg, err := c.withAnnotations(meta.Annotations, pre+"metadata.annotations")
	if err != nil {
		return err
	}
	m := meta.DeepCopy()
	s := spec.DeepCopy()
	if err := cfg.apply(m, s, pre, claims); err != nil {
		return err
	}
	*meta, *spec = *m, *s
	return nil
}

func (c Config) apply(meta *metav1.ObjectMeta, spec *corev1.PodSpec, pre string, claims []string) error {
	conflict := func(field, format string, a ...any) error {
		return fmt.Errorf("%w: %s%s: %s", ErrConflict, pre, field, fmt.Sprintf(format, a...))
	}
	for i, ct := range spec.Containers {
		if ct.Name == ContainerName {
			return conflict(fmt.Sprintf("spec.containers[%d]", i),
				"a regular container is named %q; tidepool runs as a native sidecar (an init container with restartPolicy: Always): remove that container, or rename it", ContainerName)
		}
	}
	if len(spec.Containers) == 0 {
		return fmt.Errorf("%w: %sspec.containers: empty; there is no engine container to give the socket to", ErrInvalid, pre)
	}
	sidecarAt := slices.IndexFunc(spec.InitContainers, func(ct corev1.Container) bool { return ct.Name == ContainerName })
	injected := sidecarAt >= 0

	// Engine containers: the named ones, else the pod's default container.
	var engines []int
	if len(c.Containers) == 0 {
		engines = []int{defaultContainer(meta, spec)}
	} else {
		for _, n := range c.Containers {
			i := slices.IndexFunc(spec.Containers, func(ct corev1.Container) bool { return ct.Name == n })
			if i < 0 {
				return fmt.Errorf("%w: %smetadata.annotations[%q]: no container %q in spec.containers", ErrInvalid, pre, AnnotationContainers, n)
			}
			engines = append(engines, i)
		}
	}

	// The sidecar runs as the engines' user: the arena files and the
	// socket are 0600 (docs/kubernetes.md, "Users and directories").
	var uid, gid *int64
	for n, i := range engines {
		u, g := effectiveIDs(spec, &spec.Containers[i])
		if n > 0 && !equality.Semantic.DeepEqual(u, uid) {
			return conflict(fmt.Sprintf("spec.containers[%d].securityContext.runAsUser", i),
				"engine containers run as different users; the sidecar's files (socket, arenas) are for one user: name one engine with the %s annotation, or run them as one user", AnnotationContainers)
		}
		uid, gid = u, g
	}
	if uid == nil && spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot {
		return fmt.Errorf("%w: %sspec.securityContext: runAsNonRoot is set but no runAsUser: the sidecar must run as the engine's user (its arena files are 0600) and cannot know it; set runAsUser on the pod or the engine container", ErrInvalid, pre)
	}

	// Volumes.
	sockDir := path.Dir(c.Socket)
	ssdVolume := c.SSDVolume
	want := []corev1.Volume{
		{Name: VolumeSocket, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: VolumeArenas, VolumeSource: corev1.VolumeSource{EmptyDir: c.arenaSource()}},
		{Name: VolumeSecret, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: c.SecretName}}},
	}
	if c.SSDCapacity > 0 && ssdVolume == "" {
		ssdVolume = VolumeSSD
		want = append(want, corev1.Volume{Name: VolumeSSD, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			SizeLimit: quantity(c.SSDCapacity + c.SSDCapacity/8),
		}}})
	}
	if c.SSDCapacity > 0 && c.SSDVolume != "" && !slices.Contains(claims, c.SSDVolume) &&
		!slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.SSDVolume }) {
		return fmt.Errorf("%w: %smetadata.annotations[%q]: no volume %q in spec.volumes (or volumeClaimTemplates)", ErrInvalid, pre, AnnotationSSDVolume, c.SSDVolume)
	}
	for _, v := range want {
		i := slices.IndexFunc(spec.Volumes, func(x corev1.Volume) bool { return x.Name == v.Name })
		switch {
		case i < 0:
			spec.Volumes = append(spec.Volumes, v)
		case equality.Semantic.DeepEqual(spec.Volumes[i].VolumeSource, v.VolumeSource):
		case injected:
			spec.Volumes[i] = v // ours, from an earlier injection with other settings
		default:
			return conflict(fmt.Sprintf("spec.volumes[%d]", i),
				"a volume named %q is already there with another source (%s); tidepool needs it as %s: rename that volume", v.Name, describe(spec.Volumes[i].VolumeSource), describe(v.VolumeSource))
		}
	}

	// Engine containers: the socket and arena mounts, TIDEPOOL_SOCKET.
	engineMounts := []corev1.VolumeMount{
		{Name: VolumeSocket, MountPath: sockDir},
		{Name: VolumeArenas, MountPath: ArenaMountPath},
	}
	for _, i := range engines {
		ct := &spec.Containers[i]
		field := fmt.Sprintf("spec.containers[%d]", i)
		for _, vm := range engineMounts {
			if err := addMount(ct, vm, field, conflict); err != nil {
				return err
			}
		}
		setEnv(ct, corev1.EnvVar{Name: EnvSocket, Value: c.Socket})
	}

	sidecar, err := c.sidecar(ssdVolume, uid, gid)
	if err != nil {
		return err
	}
	if injected {
		spec.InitContainers[sidecarAt] = sidecar
	} else {
		spec.InitContainers = append(spec.InitContainers, sidecar)
	}
	if meta.Labels == nil {
		meta.Labels = map[string]string{}
	}
	meta.Labels[LabelMember] = "true"
	return nil
}

// arenaSource is the arena volume: memory, or hugepages when asked.
func (c Config) arenaSource() *corev1.EmptyDirVolumeSource {
	switch c.Hugepages {
	case "2Mi":
		return &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumHugePagesPrefix + "2Mi"}
	case "1Gi":
		return &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumHugePagesPrefix + "1Gi"}
	}
	// The size limit leaves room for the lock file and a last, short arena.
	return &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: quantity(c.DRAMCapacity + 64<<20)}
}

// sidecar builds the tidepool init container.
func (c Config) sidecar(ssdVolume string, uid, gid *int64) (corev1.Container, error) {
	dirs := []string{path.Dir(c.Socket), ArenaMountPath}
	args := []string{
		"serve",
		"--socket=" + c.Socket,
		"--arena-dir=" + ArenaMountPath,
		"--dram-capacity=" + exactBytes(c.DRAMCapacity),
		"--ssd-capacity=" + exactBytes(c.SSDCapacity),
	}
	if c.Hugepages == "1Gi" {
		args = append(args, "--arena-size=1GiB")
	}
	if c.SSDCapacity > 0 {
		args = append(args, "--data-dir="+DataMountPath)
		dirs = append(dirs, DataMountPath)
	} else {
		// No SSD tier: data_dir only holds the lock file; keep it in the
		// socket volume.
		args = append(args, "--data-dir="+path.Dir(c.Socket)+"/data")
	}
	args = append(args,
		"--trusted-dirs="+strings.Join(dirs, ","),
		"--bind-addr=0.0.0.0",
		"--advertise-addr=$(POD_IP)",
		"--join="+c.Join,
		fmt.Sprintf("--metrics-addr=$(POD_IP):%d", PortMetrics),
		"--gossip-key-file="+SecretPath+"/gossip.key",
		"--peer-secret-file="+SecretPath+"/peer.secret",
		"--log-format=json",
	)
	always := corev1.ContainerRestartPolicyAlways
	no := false
	probe := func(p string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: p, Port: intstr.FromString("metrics")}},
			PeriodSeconds:    period,
			FailureThreshold: failures,
		}
	}
	mem := c.MemoryOverhead
	limits := corev1.ResourceList{}
	requests := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(c.CPURequest)}
	if c.Hugepages != "" {
		hp := corev1.ResourceName(corev1.ResourceHugePagesPrefix + c.Hugepages)
		limits[hp] = *quantity(c.DRAMCapacity)
		requests[hp] = *quantity(c.DRAMCapacity)
	} else {
		// tmpfs pages are charged to the cgroup that first touches them:
		// the sidecar reserves (fallocates) every arena at start.
		mem += c.DRAMCapacity + 64<<20
	}
	limits[corev1.ResourceMemory] = *quantity(mem)
	requests[corev1.ResourceMemory] = *quantity(mem)
	if c.SSDCapacity > 0 && ssdVolume == VolumeSSD {
		requests[corev1.ResourceEphemeralStorage] = *quantity(c.SSDCapacity)
	}
	sc := &corev1.SecurityContext{
		AllowPrivilegeEscalation: &no,
		ReadOnlyRootFilesystem:   ptr(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		RunAsUser:                uid,
		RunAsGroup:               gid,
	}
	if uid == nil {
		// The engine's image decides its user; the common engine images
		// (vllm/vllm-openai, lmsysorg/sglang) run as root. The tidepool
		// image's own user (65532) would be shut out of the engine's
		// files, so run as root too, without capabilities.
		sc.RunAsUser, sc.RunAsGroup = ptr(int64(0)), ptr(int64(0))
	}
	if c.RDMA {
		limits[corev1.ResourceName(c.RDMAResource)] = resource.MustParse("1")
		requests[corev1.ResourceName(c.RDMAResource)] = resource.MustParse("1")
		sc.Capabilities.Add = []corev1.Capability{"IPC_LOCK"}
	}
	mounts := []corev1.VolumeMount{
		{Name: VolumeSocket, MountPath: path.Dir(c.Socket)},
		{Name: VolumeArenas, MountPath: ArenaMountPath},
	}
	if c.SSDCapacity > 0 {
		mounts = append(mounts, corev1.VolumeMount{Name: ssdVolume, MountPath: DataMountPath})
	}
	mounts = append(mounts, corev1.VolumeMount{Name: VolumeSecret, MountPath: SecretPath, ReadOnly: true})
	field := func(p string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}
	}
	return corev1.Container{
		Name:            ContainerName,
		Image:           c.Image,
		ImagePullPolicy: corev1.PullPolicy(c.ImagePullPolicy),
		Args:            args,
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
			{Name: "POD_IP", ValueFrom: field("status.podIP")},
			{Name: "NODE_NAME", ValueFrom: field("spec.nodeName")},
		},
		Ports: []corev1.ContainerPort{
			{Name: "gossip", ContainerPort: PortGossip, Protocol: corev1.ProtocolTCP},
			{Name: "gossip-udp", ContainerPort: PortGossip, Protocol: corev1.ProtocolUDP},
			{Name: "peer", ContainerPort: PortPeer, Protocol: corev1.ProtocolTCP},
			{Name: "transfer", ContainerPort: PortTransfer, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: PortMetrics, Protocol: corev1.ProtocolTCP},
		},
		Resources:       corev1.ResourceRequirements{Limits: limits, Requests: requests},
		VolumeMounts:    mounts,
		StartupProbe:    probe("/healthz", 1, 120),
		ReadinessProbe:  probe("/readyz", 5, 3),
		LivenessProbe:   probe("/healthz", 10, 3),
		RestartPolicy:   &always,
		SecurityContext: sc,
	}, nil
}

// meshProxies are sidecars other injectors add as regular containers;
// none of them is the engine.
var meshProxies = []string{"istio-proxy", "linkerd-proxy", "daprd"}

// defaultContainer is the engine when the pod names none: the container
// of kubectl's default-container annotation, else the first container
// that is not a mesh proxy (a webhook that ran before this one may have
// put one first).
func defaultContainer(meta *metav1.ObjectMeta, spec *corev1.PodSpec) int {
	if n := meta.Annotations["kubectl.kubernetes.io/default-container"]; n != "" {
		if i := slices.IndexFunc(spec.Containers, func(ct corev1.Container) bool { return ct.Name == n }); i >= 0 {
			return i
		}
	}
	for i, ct := range spec.Containers {
		if !slices.Contains(meshProxies, ct.Name) {
			return i
		}
	}
	return 0
}

// effectiveIDs is the user and group a container runs as when the pod
// spec says so (nil: the image decides).
func effectiveIDs(spec *corev1.PodSpec, ct *corev1.Container) (uid, gid *int64) {
	if p := spec.SecurityContext; p != nil {
		uid, gid = p.RunAsUser, p.RunAsGroup
	}
	if s := ct.SecurityContext; s != nil {
		if s.RunAsUser != nil {
			uid = s.RunAsUser
		}
		if s.RunAsGroup != nil {
			gid = s.RunAsGroup
		}
	}
	return uid, gid
}

// addMount mounts vm in ct unless it is there; another volume at its path,
// or its volume at another path, is a conflict.
func addMount(ct *corev1.Container, vm corev1.VolumeMount, field string, conflict func(string, string, ...any) error) error {
	for j, m := range ct.VolumeMounts {
		switch {
		case m.Name == vm.Name && m.MountPath == vm.MountPath:
			return nil
		case m.MountPath == vm.MountPath:
			return conflict(fmt.Sprintf("%s.volumeMounts[%d]", field, j), "volume %q is mounted at %s, where tidepool mounts %q", m.Name, m.MountPath, vm.Name)
		case m.Name == vm.Name:
			// An earlier injection with another socket path: move it.
			ct.VolumeMounts[j].MountPath = vm.MountPath
			return nil
		}
	}
	ct.VolumeMounts = append(ct.VolumeMounts, vm)
	return nil
}

// setEnv sets a plain variable, replacing one of that name.
func setEnv(ct *corev1.Container, ev corev1.EnvVar) {
	for j, e := range ct.Env {
		if e.Name == ev.Name {
			ct.Env[j] = ev
			return
		}
	}
	ct.Env = append(ct.Env, ev)
}

// describe names a volume source for an error message.
func describe(v corev1.VolumeSource) string {
	switch {
	case v.EmptyDir != nil:
		s := "emptyDir"
		if v.EmptyDir.Medium != "" {
			s += " medium " + string(v.EmptyDir.Medium)
		}
		if v.EmptyDir.SizeLimit != nil {
			s += " sizeLimit " + v.EmptyDir.SizeLimit.String()
		}
		return s
	case v.Secret != nil:
		return "secret " + v.Secret.SecretName
	case v.HostPath != nil:
		return "hostPath " + v.HostPath.Path
	case v.PersistentVolumeClaim != nil:
		return "persistentVolumeClaim " + v.PersistentVolumeClaim.ClaimName
	case v.ConfigMap != nil:
		return "configMap " + v.ConfigMap.Name
	}
	return "another kind of volume"
}

// exactBytes writes n for a serve flag without rounding: 4GiB, 1536MiB,
// or plain bytes.
func exactBytes(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}} {
		if n != 0 && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

func quantity(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.BinarySI) }

func ptr[T any](v T) *T { return &v }
