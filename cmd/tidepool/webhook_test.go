package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeTestCert writes a self-signed certificate for 127.0.0.1 as
// tls.crt and tls.key into dir and returns a pool that trusts it.
func writeTestCert(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// `tidepool webhook` as deployed: ready on its health port, answers an
// AdmissionReview over HTTPS with the injector flags it was given, and
// exits 0 on SIGTERM.
func TestWebhookCommand(t *testing.T) {
	dir := t.TempDir()
	pool := writeTestCert(t, dir)
	addr, health := freeLoopback(t), freeLoopback(t)
	cmd := exec.Command(binPath, "webhook", "--addr", addr, "--health-addr", health, "--cert-dir", dir,
		"--image", "example.com/tidepool:e2e", "--dram-capacity", "1GiB", "--log-format", "console")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("webhook stderr:\n%s", stderr.String())
		}
	}()

	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + health + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhook not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}

	body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"e2e","kind":{"group":"","version":"v1","kind":"Pod"},` +
		`"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"inference","operation":"CREATE",` +
		`"object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"e","image":"e"}]}}}}`
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	resp, err := client.Post(fmt.Sprintf("https://%s/inject", addr), "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var rev struct {
		Response struct {
			UID     string `json:"uid"`
			Allowed bool   `json:"allowed"`
			Patch   []byte `json:"patch"`
		} `json:"response"`
	}
	err = json.NewDecoder(resp.Body).Decode(&rev)
	resp.Body.Close()
	if err != nil || rev.Response.UID != "e2e" || !rev.Response.Allowed {
		t.Fatalf("response %+v, %v", rev, err)
	}
	for _, want := range []string{"example.com/tidepool:e2e", "--dram-capacity=1GiB", `"restartPolicy":"Always"`} {
		if !bytes.Contains(rev.Response.Patch, []byte(want)) {
			t.Errorf("patch lacks %s:\n%s", want, rev.Response.Patch)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("webhook did not stop on SIGTERM")
	}
}
