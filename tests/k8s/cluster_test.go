package k8s

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// cluster is etcd and kube-apiserver on loopback, with an admin client.
type cluster struct {
	dir        string // work directory: certificates, data, logs, kubeconfig
	ca         *authority
	apiURL     string
	kubeconfig string
	client     *kubernetes.Clientset
	apiserver  *process
}

// authority is a CA that signs the test's certificates.
type authority struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newAuthority(t *testing.T) *authority {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tidepool-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &authority{cert: cert, key: key, certPEM: pemBlock("CERTIFICATE", der)}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func keyPEM(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pemBlock("EC PRIVATE KEY", der)
}

// issue signs a certificate: a server's for the names and IPs given, a
// client's (CN, O) when usage is ExtKeyUsageClientAuth.
func (a *authority) issue(t *testing.T, cn string, orgs []string, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (certPEM, keyPEMBytes []byte) {
	t.Helper()
	key := newKey(t)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	return pemBlock("CERTIFICATE", der), keyPEM(t, key)
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// process is a child process whose output goes to a log file, stopped
// (SIGTERM, then SIGKILL) when the test ends.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func start(t *testing.T, dir, name string, argv ...string) *process {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail returns the last lines of the process's log, for failure messages.
func (p *process) tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return p.name + " log (" + p.log + "):\n" + strings.Join(lines, "\n")
}

// waitFor polls ready until it returns nil, the process exits or the
// deadline passes (a bound on waiting, not a speed check: a slow machine
// only waits longer).
func waitFor(t *testing.T, what string, p *process, limit time.Duration, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	var err error
	for {
		if err = ready(); err == nil {
			return
		}
		if p != nil && p.exited() {
			t.Fatalf("%s: %s exited: %v\n%s", what, p.name, err, p.tail())
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("%s: not ready after %v: %v", what, limit, err)
			if p != nil {
				msg += "\n" + p.tail()
			}
			t.Fatal(msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startCluster starts etcd and kube-apiserver on loopback ports with
// certificates made here, and waits for the API server's /readyz.
func startCluster(t *testing.T, apiserver string) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{dir: dir, ca: newAuthority(t)}
	pki := filepath.Join(dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(pki, "ca.crt"), c.ca.certPEM)
	crt, key := c.ca.issue(t, "kube-apiserver", nil, x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	writeFile(t, filepath.Join(pki, "apiserver.crt"), crt)
	writeFile(t, filepath.Join(pki, "apiserver.key"), key)
	adminCrt, adminKey := c.ca.issue(t, "admin", []string{"system:masters"}, x509.ExtKeyUsageClientAuth, nil, nil)
	writeFile(t, filepath.Join(pki, "sa.key"), keyPEM(t, newKey(t)))

	etcdClient, etcdPeer := freePort(t), freePort(t)
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	etcd := start(t, dir, "etcd", "etcd", "--name", "test", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL)
	waitFor(t, "etcd", etcd, 2*time.Minute, func() error {
		resp, err := http.Get(clientURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /health: %s", resp.Status)
		}
		return nil
	})

	port := freePort(t)
	c.apiURL = fmt.Sprintf("https://127.0.0.1:%d", port)
	api := start(t, dir, "kube-apiserver", apiserver,
		"--etcd-servers="+clientURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--client-ca-file="+filepath.Join(pki, "ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(pki, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		"--profiling=false",
		// The "kubernetes" Service's endpoints may not be loopback
		// addresses; nothing here needs them.
		"--endpoint-reconciler-type=none",
	)
	c.apiserver = api
	c.client = kubernetes.NewForConfigOrDie(&rest.Config{
		Host:            c.apiURL,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.ca.certPEM, CertData: adminCrt, KeyData: adminKey},
		QPS:             50, Burst: 100,
	})
	waitFor(t, "kube-apiserver", api, 4*time.Minute, func() error {
		body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err != nil {
			return fmt.Errorf("%v: %s", err, body)
		}
		return nil
	})

	c.kubeconfig = filepath.Join(dir, "kubeconfig")
	writeFile(t, c.kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: admin
  user: {client-certificate-data: %s, client-key-data: %s}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, c.apiURL, b64(c.ca.certPEM), b64(adminCrt), b64(adminKey))))
	return c
}

// kubectl runs kubectl against the cluster and returns its combined output.
func (c *cluster) kubectl(args ...string) (string, error) {
	return c.kubectlIn(nil, args...)
}

// kubectlIn runs kubectl with stdin.
func (c *cluster) kubectlIn(stdin []byte, args ...string) (string, error) {
	bin := os.Getenv("KUBECTL")
	if bin == "" {
		bin = "kubectl"
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", c.kubeconfig, "--cache-dir", filepath.Join(c.dir, "kubectl-cache")}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// failedOpen counts the API server's log lines saying a call to the named
// webhook failed and the request went on without it (failurePolicy
// Ignore).
func (c *cluster) failedOpen(hook string) int {
	b, _ := os.ReadFile(c.apiserver.log)
	return strings.Count(string(b), "Failed calling webhook, failing open "+hook+":")
}
